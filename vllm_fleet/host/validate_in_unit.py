"""Run the release's validator as the service will run: its user, inside the instance unit's own sandbox
and environment (its secrets left out), as a transient systemd unit. Host side, stdlib only; run as root.

Why: as root the validator passed a chat template only root can read, and the restarted service died on
it; and root's torch import read the host's /tmp, where the vllm user could plant entries that failed
every later validation (and with it key rotation) on its host. Here a path the service cannot reach
fails before any restart, and root imports no vLLM at all.

The staged config is copied into a fresh root-owned directory the sandbox can read and nobody else can
write. The validator prints its findings on stdout, each line led by a token made for this run, after
all its other output; root takes them as data only (bounded, parsed as JSON) and writes them beside
the staged config, where the check after the restart reads them. A run that ends without its
findings (killed, or cut short) is a failure, whatever its exit status, and leaves the findings of the
last passed validation as they were.

Usage: python3 validate_in_unit.py STAGED.yaml --python PY --validator validate_serve.py
           --environment ENVFILE --instance NAME --user USER [-p KEY=VALUE ...] -- [VALIDATOR ARGS]
       exit status: 0 accepted; the validator's own (1: rejected, reason on stderr), or systemd-run's
       when the unit could not start; 2 when the findings are missing or unreadable
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if TYPE_CHECKING:  # uploaded beside this script; its top level imports the stdlib only, never vLLM
    from vllm_fleet.host import validate_serve
else:
    import validate_serve

WORK = "/run/vllm-fleet/validate"
# what the validator finds, written beside the staged config; the first one on every pass
OUTPUTS = (validate_serve.AT_DEFAULT, validate_serve.ROUTES)
IMPORTED = validate_serve.IMPORTED  # the release's source files the validator imported
MAX_OUTPUT = 4 << 20
TIMEOUT_S = 1800  # a validator left behind by a controller that went away is stopped


def unit_name(instance: str, token: str) -> str:
    """One unit per run, and never an instance's (`vllm-<name>.service`, names [a-z0-9-])."""
    return f"vllm_fleet-validate-{instance}-{token[:8]}"


def unit_argv(unit: str, user: str, properties: list[str], environment: str, command: list[str]
              ) -> list[str]:
    """systemd-run's argv: the unit's own properties, then what this run needs on top of them. A oneshot
    service, so that a validator ended by a signal is a failure (for other types SIGTERM is a clean
    exit)."""
    props = [*properties, f"User={user}", f"Group={user}", f"EnvironmentFile={environment}",
             "Type=oneshot", f"TimeoutStartSec={TIMEOUT_S}"]
    return ["systemd-run", "--quiet", "--pipe", "--wait", "--collect", f"--unit={unit}",
            *(a for p in props for a in ("-p", p)), *command]


def read_lines(stream, token: str, echo) -> dict[str, bytes]:
    """Pass the validator's output on as it comes; keep its findings (`TOKEN SUFFIX JSON` lines)."""
    found: dict[str, bytes] = {}
    size = 0
    lead = f"{token} ".encode()
    for line in stream:
        if not line.startswith(lead):
            echo(line)
            continue
        suffix, _, data = line[len(lead):].partition(b" ")
        size += len(data)
        if suffix.decode(errors="replace") in (*OUTPUTS, IMPORTED) and size <= MAX_OUTPUT:
            found[suffix.decode()] = data.strip()
    return found


def put_findings(found: dict[str, bytes], staged: str) -> list[str]:
    """The findings of a passed validation beside the staged config: each one replaced, the ones this
    run did not find removed. Nothing is written unless all of them are valid JSON."""
    if OUTPUTS[0] not in found:
        return [f"no {OUTPUTS[0]} finding: the validator ended without its verdict"]
    problems = []
    for suffix, data in found.items():
        if suffix not in OUTPUTS:
            continue
        try:
            json.loads(data)
        except ValueError:
            problems.append(f"{suffix}: not JSON")
    if problems:
        return problems
    for suffix in OUTPUTS:
        path = staged + suffix
        if suffix not in found:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        tmp = f"{path}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(found[suffix])
        os.replace(tmp, path)
    return []


# compiles those of the NUL-separated files on stdin whose bytecode is missing or stale: the check
# imports thousands of modules, and recompiling the fresh ones made every check pay for all of them;
# nothing of the release is imported
_COMPILE = ("import compileall, sys\n"
            "for f in sys.stdin.buffer.read().decode().split('\\0'):\n"
            "    f and compileall.compile_file(f, quiet=2)\n")


def release_sources(listed: object, release: str) -> list[str]:
    """The resolved paths of the listed source files that lie inside `release` (itself resolved), in
    directories only root writes: what root may compile. A name with a control character, or one
    that is not a plain .py file there, is left out."""
    if not isinstance(listed, list):
        return []
    out = []
    for name in listed:
        if not isinstance(name, str) or any(c in name for c in "\0\r\n") or name != name.strip():
            continue
        try:
            path = os.path.realpath(name)
        except (ValueError, OSError):
            continue
        if not (path.endswith(".py") and path.startswith(release + os.sep) and os.path.isfile(path)):
            continue
        d, safe = os.path.dirname(path), True
        while safe and len(d) >= len(release):
            st = os.lstat(d)
            safe = st.st_uid == os.geteuid() and not st.st_mode & 0o022
            d = os.path.dirname(d)
        if safe:
            out.append(path)
    return list(dict.fromkeys(out))


def compile_imported(found: dict[str, bytes], python: str) -> None:
    """Bytecode for the release's modules the check imported, written by root into the root-owned
    release: the service (which cannot write there) and every later check then load them compiled, as
    pip-installed packages are. Only resolved source files inside the release are compiled; compiling
    runs no module code, and the interpreter starts isolated (-I -S: no site, no .pth files). Best
    effort: it never changes the check's verdict."""
    try:
        files = release_sources(json.loads(found.get(IMPORTED, b"[]")),
                                os.path.realpath(os.path.dirname(os.path.dirname(python))))
        if files:
            subprocess.run([python, "-I", "-S", "-c", _COMPILE], input="\0".join(files).encode(), cwd="/",
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=600,
                           preexec_fn=lambda: os.umask(0o022))
    except (ValueError, OSError, subprocess.SubprocessError):
        pass


def _work_dir() -> str:
    """A fresh directory for this run under WORK: root's, readable by the sandbox, whatever the umask."""
    os.makedirs(WORK, exist_ok=True)
    for d in (os.path.dirname(WORK), WORK):
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise SystemExit(f"{d} is not a directory of root's; nothing was validated")
        os.chmod(d, 0o755)
    work = tempfile.mkdtemp(dir=WORK)
    os.chmod(work, 0o755)
    return work


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="validate_in_unit.py")
    ap.add_argument("staged")
    ap.add_argument("--python", required=True)
    ap.add_argument("--validator", required=True)
    ap.add_argument("--environment", required=True)
    ap.add_argument("--instance", required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("-p", dest="properties", action="append", default=[])
    a = ap.parse_args(argv[:split])
    token = secrets.token_hex(16)
    work = _work_dir()
    try:
        config = os.path.join(work, os.path.basename(a.staged))  # its name in the validator's lines
        shutil.copyfile(a.staged, config)
        os.chmod(config, 0o644)  # the service reads its live config as well; no secret is in it
        command = [a.python, a.validator, config, validate_serve.FINDINGS, token, *argv[split + 1:]]
        with subprocess.Popen(unit_argv(unit_name(a.instance, token), a.user, a.properties, a.environment,
                                        command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            found = read_lines(proc.stdout, token, lambda line: (sys.stdout.buffer.write(line),
                                                                  sys.stdout.flush()))
        if proc.returncode != 0:
            return proc.returncode
        problems = put_findings(found, a.staged)
        if problems:
            print(f"the validator's findings could not be taken: {'; '.join(problems)}", file=sys.stderr)
            return 2
        compile_imported(found, a.python)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)  # root's files only: the sandbox could write none here


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
