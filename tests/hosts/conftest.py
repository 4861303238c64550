"""Real lab hosts for the whole session: booted once, deployed once, shared by every lab test.

These tests talk to real systemd hosts over real SSH and to a real vLLM (CPU build) serving the tiny
model made locally. They need root and the lab's tools; `make test` installs both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import fleetlab as lab
from fleetlab.inventory import TINY_MODEL
from fleetlab.tinymodel import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
INVENTORY = str(Path(__file__).with_name("inventory.py"))


@dataclass
class Run:
    rc: int
    output: str
    smoke: list[dict]

    def op_rows(self) -> dict[str, tuple[str, str, str, str]]:
        """pyinfra's results table: op name, without its deploy's name ("vLLM | "), -> (hosts, success,
        error, no change)."""
        rows = {}
        block = self.output.split("--> Results:", 1)[-1]
        for line in block.splitlines():
            m = re.match(r"^\s{4}(.+?)\s{2,}(\d+|-)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", line)
            if m and m.group(1) != "Operation":
                rows[m.group(1).strip().split(" | ", 1)[-1]] = m.groups()[1:]
        return rows

    def changed_ops(self) -> list[str]:
        """Operations that changed something: a converged host has none, its smoke test included."""
        return [name for name, (_, ok, _, _) in self.op_rows().items() if ok != "-" and name != "Grand total"]


def deploy(deploy_file: str = "deploys/vllm.py", overrides: dict | None = None,
           env: dict | None = None, unset: tuple[str, ...] = (), extra: tuple[str, ...] = (),
           limit: str | None = None, timeout: int = 1500, yes: bool = True) -> Run:
    e = {**os.environ, **(env or {})}
    for k in unset:
        e.pop(k, None)
    e["VLLM_FLEET_TEST_OVERRIDES"] = json.dumps(overrides or {})
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        smoke_json = tf.name
    Path(smoke_json).unlink()
    e["VLLM_FLEET_SMOKE_JSON"] = smoke_json
    # "a.py b.py": two deploys, one run; without -y pyinfra detects and prints the changes (and diffs)
    cmd = [PYINFRA, *(["-y"] if yes else []), *extra, INVENTORY, *deploy_file.split()]
    if limit:  # "lab1,lab2": pyinfra takes one --limit per pattern
        cmd[1:1] = [arg for name in limit.split(",") for arg in ("--limit", name)]
    proc = subprocess.run(cmd, cwd=ROOT, env=e, text=True, capture_output=True, timeout=timeout)
    smoke = json.loads(Path(smoke_json).read_text()) if Path(smoke_json).exists() else []
    Path(smoke_json).unlink(missing_ok=True)
    return Run(proc.returncode, proc.stdout + proc.stderr, smoke)


def on(host: str, command: str, stdin: str | None = None) -> str:
    """The tests' own look at a host, as root (the harness's login, not the deploy's)."""
    h = lab.LabHost(int(host.removeprefix("lab")))
    return lab.ssh(h, command, timeout=60, stdin=stdin).stdout


def api_get(host: str, path: str, instance: str = "default", port: int = 8000,
            key: str | None = None) -> tuple[int, str]:
    """GET on the host's loopback with the key from its env file (or `key`, sent inside the script on
    stdin), so no key is ever in an argv."""
    read_key = ("env = dict(l.split('=', 1) for l in open('/etc/vllm/" + instance + ".env') if '=' in l)\n"
                "key = env['VLLM_API_KEY'].strip().strip(chr(34))\n") if key is None else f"key = {key!r}\n"
    script = (
        "import sys, urllib.request, urllib.error\n"
        + read_key +
        f"req = urllib.request.Request('http://127.0.0.1:{port}{path}', "
        "headers={'Authorization': 'Bearer ' + key})\n"
        "try:\n    r = urllib.request.urlopen(req, timeout=30); print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n"
    )
    out = on(host, "python3 -", stdin=script)
    status, _, body = out.partition("\n")
    return int(status or 0), body


def unit_props(host: str, unit: str = "vllm-default.service") -> dict[str, str]:
    text = on(host, f"systemctl show {unit} -p ActiveState -p MainPID -p ActiveEnterTimestampMonotonic")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def host_files_digest(host: str) -> str:
    """Hashes of everything a deploy writes, to prove a refused deploy changed nothing."""
    return on(host, "find /etc/vllm /etc/systemd/system /opt/vllm /var/lib/vllm /opt/vllm/models/*/* "
                    "-maxdepth 3 "
                    "\\( -type f -o -type l \\) -not -path '*/releases/*' 2>/dev/null | sort | "
                    "xargs -r sha256sum; readlink /opt/vllm/current")


@pytest.fixture(scope="session")
def lab_hosts():
    if os.geteuid() != 0:
        pytest.skip("lab tests need root (systemd-nspawn)")
    booted_here = not lab.read_state()
    hosts = lab.up(2, plain=1)
    make_tiny_model(TINY_MODEL)
    yield [h.name for h in hosts if h.role == "vllm"][:2]
    if booted_here and os.environ.get("CI") and not os.environ.get("VLLM_FLEET_KEEP_LAB"):
        lab.down()


@pytest.fixture(scope="session")
def deployed(lab_hosts):
    """The first deploy of the session (a full install on fresh hosts): the session's hosts only."""
    run = deploy(limit=",".join(lab_hosts))
    assert run.rc == 0, run.output[-6000:]
    return run


WRONG_SHAPE = "/srv/vllm-fleet-test/wrong-shape"
REMOTE_CODE = "/srv/vllm-fleet-test/remote-code"


def _tiny_model_copy(host: str, dest: str, edit: str, then: str = "") -> str:
    """The tiny model's files at `dest` on `host`, its config.json changed by `edit` (Python on `c`)."""
    on(host, f"rm -rf {dest} && mkdir -p {dest} && "
             f"cp -r \"$(dirname \"$(ls -d /opt/vllm/models/tiny-llama/*/config.json | head -1)\")\"/. "
             f"{dest}/ && python3 -c \"import json; p='{dest}/config.json'; "
             f"c=json.load(open(p)); {edit}; json.dump(c, open(p, 'w'))\"{then} && "
             "chmod -R a+rX /srv/vllm-fleet-test")
    return dest


def wrong_shape_model(host: str) -> str:
    """A model the check before a restart cannot fault, which the restarted service cannot load: the
    tiny model's files on `host` with its config.json's intermediate_size doubled. The engine config
    builds from config.json alone; loading the weights then fails on their shapes, after the restart,
    which is what the rollback tests need (a missing model is now refused before the restart)."""
    return _tiny_model_copy(host, WRONG_SHAPE, "c['intermediate_size'] *= 2")


def remote_code_model(host: str) -> str:
    """The tiny model with a config class of its own (config.json's `auto_map`), whose module raises at
    import, saying which uid imported it: the code of a `trust_remote_code` model, which building vLLM's
    engine config runs."""
    return _tiny_model_copy(
        host, REMOTE_CODE, "c['auto_map'] = {'AutoConfig': 'configuration_probe.ProbeConfig'}",
        then=" && printf '%s\\n' 'import os' "
             "'raise RuntimeError(f\"the model code ran as uid {os.getuid()}\")' "
             f"> {REMOTE_CODE}/configuration_probe.py")
