"""Issue 15: one inventory holds vLLM hosts and a plain host (lab8, a "database" with no vllm data).
The vLLM deploys never touch lab8 and say so; another deploy in the same pyinfra run configures it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.hosts.conftest import INVENTORY, ROOT, deploy, on, unit_props

NOTE = "skipped 1 host(s) without vllm data, left untouched: lab8"
# everything a vLLM deploy would make on a host
VLLM_PATHS = ("/etc/vllm /opt/vllm /var/lib/vllm /var/lib/vllm-fleet /usr/local/lib/vllm-fleet "
              "/usr/local/bin/uv")


def vllm_fleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), *args], cwd=ROOT, env=os.environ,
                          text=True, capture_output=True, timeout=600)


def test_the_vllm_deploy_and_another_deploy_share_one_run(deployed):
    converged = deploy()  # whatever an earlier module left: the vLLM hosts on the inventory's config
    assert converged.rc == 0, converged.output[-4000:]
    pids = {h: unit_props(h)["MainPID"] for h in ("lab1", "lab2")}
    on("lab8", "rm -f /etc/lab-role")
    run = deploy(extra=(), deploy_file="deploys/vllm.py tests/hosts/deploys/plain.py")
    assert run.rc == 0, run.output[-4000:]
    assert NOTE in run.output
    assert on("lab8", "cat /etc/lab-role").strip() == "role=database"
    assert on("lab8", f"ls -d {VLLM_PATHS} 2>/dev/null; ls /etc/systemd/system | grep -c '^vllm-'; "
                      "id vllm 2>&1 >/dev/null | head -c 0; getent passwd vllm").split() == ["0"]
    # the plain host's sudo log holds the other deploy's commands and not one of the vLLM deploy's
    sudo_log = on("lab8", "journalctl SYSLOG_IDENTIFIER=sudo --no-pager -o cat | grep COMMAND=")
    assert "lab-role" in sudo_log and "vllm" not in sudo_log.replace("/etc/lab-role", ""), sudo_log[-2000:]
    assert {h: unit_props(h)["MainPID"] for h in ("lab1", "lab2")} == pids
    assert sorted(r["host"] for r in run.smoke) == ["lab1", "lab2"]


def test_plan_status_rollout_and_rollback_skip_the_plain_host_and_say_so(deployed):
    plan = vllm_fleet("plan", INVENTORY)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-2000:]
    assert NOTE in plan.stdout and not any(line.startswith("lab8") for line in plan.stdout.splitlines())
    status = vllm_fleet("status", INVENTORY)
    assert status.returncode == 0 and NOTE in status.stdout
    assert not any(line.startswith("lab8 ") for line in status.stdout.splitlines())
    for cmd in ("rollout", "rollback"):
        only = vllm_fleet(cmd, INVENTORY, "--limit", "lab8")
        assert only.returncode == 2, only.stdout + only.stderr
        assert f"{cmd}: {NOTE}" in only.stdout and "no vLLM hosts" in only.stderr
    assert on("lab8", f"ls -d {VLLM_PATHS} 2>/dev/null").split() == []
