"""The CUDA build installed for real: PyPI's CUDA 13.0 vLLM 0.33.0 staged from one lock on Debian 13 lab
hosts, from the controller's store and from a real caching PyPI mirror, then 0.32.0 and 0.31.0 beside it
from the mirror, each release's parser taking the settings matrix; then stage-before-deploy on a serving
CPU host.

The GPU is SIMULATED: lab5 and lab6 are Debian 13 (trixie, Python 3.13) hosts whose nvidia-smi replays a
real capture (tests/fixtures/nvidia/query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt: 1x H100 80GB
HBM3, driver 590.48.01). No NVIDIA driver or GPU exists here: the plan picks cu130 from that capture, the
release is installed and imported (torch, vLLM, the fp8 and awq quantization configs), and vLLM's parser
checks the serve config; vLLM's NVML finds no GPU, so the engine config (the GPU's own checks) and serving
stay unproven without one. Nothing starts vLLM on these hosts.

The mirror is proxpi from PyPI (fleetlab/pypimirror.py) on the controller's 10.77.0.1, upstream PyPI: the
controller resolves the lock and fills its store through it, so its cache is warm for lab6, which has no
route to PyPI. The hosts run one after the other (9 GiB installed each), lab5 removed before lab6 boots.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import fleetlab as lab
from fleetlab import gpusim, pypimirror
from tests.hosts import test_validated_releases as release_matrix
from tests.hosts.conftest import ROOT, deploy, on, unit_props
from vllm_fleet.core.flags import ServeFlags, render_flags
from vllm_fleet.core.layout import HOST_TOOLS, STAGED, UV_PATH
from vllm_fleet.core.lock import Lock, broken_pairs

INVENTORY = str(Path(__file__).with_name("inventory_stage.py"))
RELEASE = "/opt/vllm/releases/0.33.0-cu130"
CLI = str(Path(sys.executable).parent / "vllm-fleet")
# on the host, with the release's own interpreter; VLLM_TARGET_DEVICE as the validator sets it where
# NVML finds no GPU (vLLM imports its CPU extension instead of probing for a device)
CHECK = ("import importlib.metadata as m, torch, vllm\n"
         "from vllm.model_executor.layers.quantization import get_quantization_config as q\n"
         "import cutlass\n"
         "print('cuda', torch.version.cuda, 'vllm', vllm.__version__, 'quant', q('fp8').__name__,"
         " q('awq').__name__, 'cuda-python', m.version('cuda-python'), 'cuda-bindings',"
         " m.version('cuda-bindings'))\n")
found: dict[str, str] = {}  # what the first host's test found, for the second's


@pytest.fixture(scope="module")
def mirror():
    url = pypimirror.start()
    yield url
    pypimirror.stop()


def _stage_host(index: int) -> lab.LabHost:
    """A trixie stage host with the replayed H100; the fixture removes it (its 9 GiB release with it)."""
    host = next(h for h in lab.up_stage([index]) if h.index == index)
    gpusim.replay(host)
    return host


def _cli(*args: str, timeout: int = 1800, version: str | None = None) -> subprocess.CompletedProcess:
    """`version` stages another release of the table than the inventory's 0.33.0."""
    env = {**os.environ, **({"VLLM_FLEET_STAGE_VERSION": version} if version else {})}
    return subprocess.run([CLI, *args], cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout)


def _host_check(host: str, release: str = RELEASE) -> str:
    out = lab.ssh(lab.LabHost(int(host.removeprefix("lab"))), f"VLLM_TARGET_DEVICE=cpu {release}/bin/python "
                  f"-c {shlex.quote(CHECK)} 2>&1 | tail -n1", timeout=600).stdout
    return out.strip()


@pytest.fixture(scope="module")
def lab5(deployed, mirror):
    host = _stage_host(5)
    yield host
    lab.remove(host)


def test_the_plan_shows_cu130_and_the_lock_resolved_for_the_trixie_hosts_python(lab5):
    plan = _cli("plan", INVENTORY, "--limit", "lab5", timeout=600)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    row = next(line for line in plan.stdout.splitlines() if line.startswith("lab5 "))
    assert "1x NVIDIA H100 80GB HBM3 (9.0, 80 GiB)" in row and "590.48.01" in row
    assert " cu130 " in row and "0.33.0-cu130" in row and "(TP 1, bfloat16)" in row
    lock_line = next(line for line in plan.stdout.splitlines() if line.startswith("lab5: lock: "))
    digest, target = re.fullmatch(r"lab5: lock: ([0-9a-f]{16}) for (\S+)", lock_line).groups()
    assert target == "cp313-x86_64-manylinux_2_40-cu130"  # trixie's 3.13 and glibc 2.41, capped at uv's 2.40
    assert digest in row
    install = next(line for line in plan.stdout.splitlines() if line.startswith("lab5: install: "))
    assert "--no-deps --require-hashes --no-index --find-links /var/cache/vllm-fleet/wheels" in install
    found["digest"] = digest


def test_staging_installs_the_lock_from_the_store_validates_and_restarts_nothing(lab5):
    digest = found["digest"]
    staged = _cli("stage", INVENTORY, "--limit", "lab5")
    out = staged.stdout + staged.stderr
    assert staged.returncode == 0, out[-5000:]
    # live progress of each long step
    assert re.search(r"\[lab5\] wheels for 0\.33\.0-cu130: \d+\.\d\d GiB of \d+\.\d\d GiB \(100%\), "
                     r"\d+ MiB/s", out)
    assert re.search(r"\[lab5\] install 0\.33\.0-cu130: \d+\.\d\d GiB unpacked of \d+\.\d\d GiB", out)
    assert re.search(r"\[lab5\] validating default\.yaml: \d+ s", out)
    assert f"wheels for 0.33.0-cu130 (lock {digest}, cp313-x86_64-manylinux_2_40-cu130)" in out
    # device-neutral: without it vLLM 0.33.0 fails here with "Failed to infer device type"
    assert "accepted (parser; no GPU is visible on this host" in out
    assert "Traceback" not in out
    # on the host: the release is the lock's, and the CUDA 13 build works as far as no GPU allows
    assert on("lab5", f"sha256sum < {RELEASE}/.lock").startswith(digest)
    check = _host_check("lab5")
    assert check.startswith("cuda 13.0 vllm 0.33.0 quant Fp8Config AutoAWQConfig cuda-python 13."), check
    assert check.split("cuda-bindings ")[1].startswith("13."), check
    lock = Lock.parse(on("lab5", f"cat {RELEASE}/.lock"))
    assert broken_pairs(lock) == [] and lock.pin("torch").version == "2.14.0"
    # nothing live: no current release, no unit, no process
    assert on("lab5", "readlink /opt/vllm/current; systemctl list-units 'vllm-*' --all --no-legend; "
                      "pgrep -f 'vllm serve'").strip() == ""
    assert on("lab5", "cat /var/lib/vllm-fleet/staged/default.validated").startswith("0.33.0-cu130 ")
    # a second stage finds it all in place
    again = _cli("stage", INVENTORY, "--limit", "lab5", timeout=600)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "build release" not in again.stdout and "validates" not in again.stdout
    found["wheels_sent"] = re.search(r"\[lab5\] wheels for 0\.33\.0-cu130: sent (\d+) of (\d+)", out)[0]


@pytest.fixture(scope="module")
def lab6(deployed, mirror):
    lab.remove(lab.LabHost(5))  # one 9 GiB release at a time
    host = _stage_host(6)
    yield host
    lab.remove(host)


def test_a_second_host_installs_the_same_lock_from_the_mirror_with_no_wheel_over_ssh(lab6, mirror):
    digest = found["digest"]
    log = pypimirror.LOG.read_text() if pypimirror.LOG.exists() else ""
    staged = _cli("stage", INVENTORY, "--limit", "lab6")
    out = staged.stdout + staged.stderr
    assert staged.returncode == 0, out[-5000:]
    assert f"lock {digest} for 0.33.0-cu130 (cp313-x86_64-manylinux_2_40-cu130)" in out
    assert "wheels for" not in out  # the controller's SSH carried the lock, no wheel
    assert on("lab6", "ls /var/cache/vllm-fleet/wheels | grep -c '[.]whl$'").strip() == "0"
    assert on("lab6", f"sha256sum < {RELEASE}/.lock").startswith(digest)
    served = pypimirror.LOG.read_text()[len(log):]
    assert re.search(r"^10\.77\.6\.2 .*GET /index/torch/torch-2\.14\.0-cp313-cp313-manylinux_2_28_x86_64"
                     r"\.whl HTTP/1\.1\" 200", served, re.M), served[-2000:]
    check = _host_check("lab6")
    assert check.startswith("cuda 13.0 vllm 0.33.0 quant Fp8Config AutoAWQConfig"), check
    assert "accepted (parser; no GPU is visible on this host" in out


# Off on 0.33 (#34): what the config says, what the release's own parser takes
OFF_FLAGS = {"enable_prefix_caching": False, "enable_chunked_prefill": False, "enforce_eager": False,
             # inverse aliases and the hidden form, as an operator may write them in extra_args
             "extra_args": {"enable-cascade-attn": True, "disable-prompt-embeds": True,
                            "enable-sleep-mode": False, "no-enable-mfu-metrics": True}}
OFF_MEANS = {"disable-prefix-caching": ["enable-prefix-caching", False],
             "disable-chunked-prefill": ["enable-chunked-prefill", False],
             "no-enforce-eager": ["enforce-eager", False],
             "enable-cascade-attn": ["disable-cascade-attn", False],
             "disable-prompt-embeds": ["enable-prompt-embeds", False],
             "no-enable-sleep-mode": ["enable-sleep-mode", False],
             "no-enable-mfu-metrics": ["enable-mfu-metrics", False]}
HIDDEN = ("from vllm.entrypoints.cli.serve import ServeSubcommand\n"
          "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
          "p = FlexibleArgumentParser(prog='vllm'); sub = p.add_subparsers(dest='subcommand')\n"
          "ServeSubcommand().subparser_init(sub); s = sub.choices['serve']\n"
          "listed = {o for a in s._actions for o in a.option_strings}\n"
          "known = s._option_string_actions\n"
          "print('--no-enable-prefix-caching' in listed, '--no-enable-prefix-caching' in known,"
          " '--disable-prefix-caching' in known)\n")


def test_off_is_off_on_0_33_as_its_own_parser_reads_the_config(lab6):
    """The staged 0.33.0 (its parser only: no GPU is visible) checks the staged config with every boolean
    turned off, rendered by the toolkit for 0.33.0 (`disable-x`, the form its help shows), and inverse
    aliases and the hidden `no-enable-x` form in extra_args. Before, the host check knew only the actions'
    option_strings, which 0.33 keeps `--no-enable-x` out of: off was refused. The release itself shows it."""
    def slow(command: str, stdin: str | None = None) -> str:  # a CUDA build's first import is slow
        return lab.ssh(lab6, command, timeout=600, stdin=stdin).stdout

    hidden = slow(f"VLLM_TARGET_DEVICE=cpu {RELEASE}/bin/python -c {shlex.quote(HIDDEN)} 2>/dev/null")
    assert hidden.split()[-3:] == ["False", "True", "True"], hidden  # hidden from the lists, still taken
    config = yaml.safe_load(on("lab6", f"cat {STAGED}/default.yaml"))
    config.pop("enforce-eager")  # the stage inventory's; turned off below
    off = render_flags(ServeFlags(**OFF_FLAGS), "0.33.0", "cuda")
    assert {k: v for k, v in off.items() if k in OFF_MEANS} == {k: True for k in OFF_MEANS}
    config.update(off)
    check = (f"{RELEASE}/bin/python {HOST_TOOLS}/validate_serve.py /root/off/{{}}.yaml --device cuda 2>&1; "
             "echo rc=$?")
    slow("mkdir -p /root/off && cat > /root/off/default.yaml", stdin=yaml.safe_dump(config))
    out = slow(check.format("default"))
    assert out.strip().endswith("rc=0"), out[-3000:]
    assert "accepted (parser; no GPU is visible on this host" in out, out[-3000:]
    found = json.loads(on("lab6", "cat /root/off/default.yaml.at-default"))
    assert {k: v for k, v in found["settings"].items() if k in OFF_MEANS} == OFF_MEANS
    # one setting twice is refused naming both keys
    slow("cat > /root/off/twice.yaml", stdin=yaml.safe_dump({**config, "no-enable-prefix-caching": True}))
    out = slow(check.format("twice"))
    assert out.strip().endswith("rc=1"), out[-2000:]
    assert "are both set: they are one setting of vLLM's (enable-prefix-caching)" in out, out[-2000:]


def test_the_release_matrix_on_the_staged_0_33(lab6):
    """tests/hosts/test_validated_releases.py's settings, rendered for 0.33.0 (inverse aliases included),
    each taken by the staged release's parser exactly as the plan says."""
    print("\n".join(release_matrix.check(lab6, f"{RELEASE}/bin/python", "0.33.0", "cuda", "cuda")))


@pytest.mark.parametrize("release_dir", ["0.32.0-cu130", "0.31.0-cu130"])
def test_each_other_cuda_13_release_stages_from_the_mirror_and_takes_the_matrix(lab6, release_dir):
    """The table's other CUDA 13 builds on the same host, from the mirror: each resolves its own lock
    (torch 2.13.0, not 0.33.0's 2.14.0), installs beside 0.33.0 (uv links the wheels they share),
    imports as a CUDA 13.0 build, and its parser takes the matrix as the plan says."""
    version = release_dir.removesuffix("-cu130")
    staged = _cli("stage", INVENTORY, "--limit", "lab6", version=version)
    out = staged.stdout + staged.stderr
    assert staged.returncode == 0, out[-5000:]
    assert re.search(rf"lock [0-9a-f]{{16}} for {release_dir} \(cp313-x86_64-manylinux_2_40-cu130\)", out), \
        out[-3000:]
    assert "accepted (parser; no GPU is visible on this host" in out and "Traceback" not in out
    release = f"/opt/vllm/releases/{release_dir}"
    assert on("lab6", f"cat {STAGED}/default.validated").startswith(f"{release_dir} ")
    check = _host_check("lab6", release)
    assert check.startswith(f"cuda 13.0 vllm {version} quant Fp8Config AutoAWQConfig cuda-python 13."), check
    lock = Lock.parse(on("lab6", f"cat {release}/.lock"))
    assert broken_pairs(lock) == [] and lock.pin("torch").version == "2.13.0"
    assert {"0.33.0-cu130", release_dir} <= set(on("lab6", "ls /opt/vllm/releases").split())
    print("\n".join(release_matrix.check(lab6, f"{release}/bin/python", version, "cuda", "cuda")))


def test_0_34_0_is_refused_at_its_pin_and_its_parser_takes_the_matrix_over_0_33_0s_dependencies(lab6, mirror):
    """PyPI cannot install 0.34.0 (it pins flashinfer-python==0.7.3, which PyPI lacks): a stage of it is
    refused naming that pin before the host is touched. Its parser is what decides whether the plan's flags
    are what it runs with, so its wheel alone goes over a linked copy of 0.33.0-cu130 and takes the matrix:
    off as 0.34.0 spells it, and its inverse aliases. The copy is removed; 0.33.0 is untouched."""
    state = (f"ls -A /opt/vllm/releases {STAGED} /var/cache/vllm-fleet; cat {STAGED}/default.validated; "
             f"sha256sum < {STAGED}/default.yaml")
    before = on("lab6", state)
    refused = _cli("stage", INVENTORY, "--limit", "lab6", timeout=900, version="0.34.0")
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "refused, nothing was changed" in out, out[-3000:]
    assert "lab6: 0.34.0-cu130: resolving vllm==0.34.0" in out, out[-3000:]
    assert "flashinfer-python==0.7.3" in out, out[-3000:]
    assert on("lab6", state) == before

    # every file of 0.33.0 by inode, size and time, and its lock: the copy shares the inodes
    release_files = (f"find {RELEASE} -printf '%i %s %T@ %p\\n' | sort | sha256sum; "
                     f"sha256sum < {RELEASE}/.lock")
    untouched = on("lab6", release_files)
    parser = "/root/vllm-0.34.0-parser"
    # UV_HTTP_TIMEOUT as roles/install.py sets it: proxpi answers an uncached file once it holds it all
    uv = (f"rm -rf {parser} && cp -al {RELEASE} {parser} && UV_HTTP_TIMEOUT=600 {UV_PATH} pip install "
          f"--quiet --no-deps --python {parser}/bin/python --index-url {mirror} vllm==0.34.0 2>&1; "
          "echo rc=$?")
    out = lab.ssh(lab6, uv, timeout=900).stdout
    assert out.strip().endswith("rc=0"), out[-3000:]
    def vllm_version(python: str) -> str:
        return on("lab6", f"{python} -c 'import importlib.metadata as m; print(m.version(\"vllm\"))'").strip()

    try:
        assert vllm_version(f"{parser}/bin/python") == "0.34.0"
        print("\n".join(release_matrix.check(lab6, f"{parser}/bin/python", "0.34.0", "cuda", "cuda")))
    finally:
        lab.ssh(lab6, f"rm -rf {parser}")
    assert on("lab6", release_files) == untouched
    assert vllm_version(f"{RELEASE}/bin/python") == "0.33.0"


def test_a_deploy_after_stage_switches_and_restarts_without_building_or_validating_again(deployed):
    """On a serving CPU host: stage a changed flag (the old process keeps serving), then deploy it."""
    before = unit_props("lab1")["MainPID"]
    change = {"lab1": {"flags": {"max_num_seqs": 6}}}
    staged = deploy("deploys/stage.py", overrides=change, limit="lab1")
    assert staged.rc == 0, staged.output[-3000:]
    assert "vLLM 0.32.0 validates default's config" in staged.changed_ops()[-1]
    assert unit_props("lab1")["MainPID"] == before
    assert "max-num-seqs: 8" in on("lab1", "cat /etc/vllm/default.yaml")
    run = deploy(overrides=change, limit="lab1")
    assert run.rc == 0, run.output[-3000:]
    changed = run.changed_ops()
    assert any(n.startswith("restart vllm-default.service") for n in changed), changed
    assert not any("validates" in n or n.startswith("build release") for n in changed), changed
    assert run.smoke and all(r["ok"] for r in run.smoke)
    assert "max-num-seqs: 6" in on("lab1", "cat /etc/vllm/default.yaml")
    back = deploy(limit="lab1")  # as the other modules expect lab1
    assert back.rc == 0, back.output[-3000:]
