"""host/asuser.py: work done with another user's rights in a child process, as the prune and the
validator use it for the vllm user's cache. Run as root with the system's `nobody` (CI runs as root),
each in a plain python3 process as on a host (the test process itself carries pyinfra's gevent
patches, under which fork and pipes behave otherwise)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

import vllm_fleet.host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")
HOST_DIR = Path(vllm_fleet.host.__file__).parent


def run_as(work: str) -> dict:
    """asuser.run_as("nobody", lambda: <work>) in a host-like interpreter."""
    code = (f"import json, os, sys; sys.path.insert(0, {str(HOST_DIR)!r}); import asuser; "
            f"print(json.dumps(asuser.run_as('nobody', lambda: {work})))")
    out = subprocess.run(["python3", "-c", code], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def test_the_work_runs_with_the_users_rights_and_the_caller_keeps_its_own() -> None:
    nobody = pwd.getpwnam("nobody")
    out = run_as("[os.getuid(), os.getgid(), os.getgroups(), os.environ['HOME']]")
    assert out == {"result": [nobody.pw_uid, nobody.pw_gid, [], nobody.pw_dir]}


def test_root_only_files_stay_out_of_reach(tmp_path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("x")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    assert run_as(f"open({str(secret)!r}).read()")["error"].startswith("PermissionError")


def test_a_child_that_dies_is_an_error_not_an_empty_answer() -> None:
    assert run_as("os._exit(3)") == {"error": "the work as nobody ended with status 768 and no answer"}
