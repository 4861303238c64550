"""Issue 5 on real hosts: a change never leaves a host worse than before.

Fault injection: a flag vLLM rejects, a model path missing on one host, the controller killed during
an install; then rollback, twice. vLLM 0.31.0 (CPU build) is the second real release.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.hosts.conftest import INVENTORY, PYINFRA, ROOT, api_get, deploy, on, unit_props, wrong_shape_model

# a transient unit polls /health every 0.5 s on the host itself, for the whole deploy (bounded count)
POLLER = ("systemd-run --quiet --collect --unit=health-poll sh -c 'for i in $(seq 1 {n}); do "
          "curl -s -o /dev/null -m 2 -w \"%{{http_code}}\\n\" http://127.0.0.1:8000/health "
          ">> /tmp/health.log; sleep 0.5; done'")


@pytest.fixture(scope="module")
def baseline(deployed):
    run = deploy()
    assert run.rc == 0, run.output[-4000:]
    return run


def state(host: str) -> dict:
    return json.loads(on(host, "python3 /usr/local/lib/vllm-fleet/hoststate.py show"))


def test_flag_vllm_rejects_stops_before_restart_and_old_service_keeps_serving(baseline):
    before = unit_props("lab1")
    on("lab1", "rm -f /tmp/health.log; " + POLLER.format(n=400))
    run = deploy(overrides={"lab1": {"flags": {"extra_args": {"max-logprobs": "many"}}}})
    polls = on("lab1", "systemctl stop health-poll 2>/dev/null; cat /tmp/health.log").split()
    assert run.rc != 0
    assert "invalid int value: 'many'" in run.output
    assert unit_props("lab1")["MainPID"] == before["MainPID"]
    assert "max-logprobs" not in on("lab1", "cat /etc/vllm/default.yaml")
    assert len(polls) > 10 and set(polls) == {"200"}, polls
    assert any(r["host"] == "lab2" and r["ok"] for r in run.smoke)  # the other host went on


def test_a_setting_vllm_would_override_is_refused_on_the_host_before_restart(baseline):
    """vLLM's parser accepts `distributed_executor_backend: uni`, but its CPU platform turns it into "mp"
    unless VLLM_ENABLE_V1_MULTIPROCESSING=0: the host check builds vLLM's engine config with the unit's
    environment and refuses the difference; nothing restarts."""
    before = unit_props("lab1")
    run = deploy(overrides={"lab1": {"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}}, limit="lab1")
    assert run.rc != 0
    assert ("vLLM would change these settings: distributed-executor-backend: the plan says uni, "
            "vLLM's engine config has mp") in run.output
    assert unit_props("lab1")["MainPID"] == before["MainPID"]


def test_a_context_longer_than_the_model_is_refused_before_restart(baseline):
    """Caught before any restart, with vLLM's own words or the plan's."""
    before = unit_props("lab1")
    run = deploy(overrides={"lab1": {"flags": {"max_model_len": 4096}}}, limit="lab1")
    assert run.rc != 0
    assert "max_model_len" in run.output and "4096" in run.output and "2048" in run.output
    assert unit_props("lab1")["MainPID"] == before["MainPID"]
    assert "max-model-len: 512" in on("lab1", "cat /etc/vllm/default.yaml")


def test_missing_model_on_one_host_rolls_back_by_itself(baseline):
    """A model whose weights do not fit its config.json: the check before the restart builds the engine
    config from config.json and passes; the restarted service fails to load the weights."""
    good = state("lab2")["current"]
    run = deploy(overrides={"lab2": {"model": {"path": None, "host_path": wrong_shape_model("lab2")}}})
    assert run.rc != 0
    assert "lab2: change failed and was rolled back to 0.32.0-cpu (serving again, rollback took " \
        in run.output
    print(next(line for line in run.output.splitlines() if "rollback took" in line))
    lab2 = [r for r in run.smoke if r["host"] == "lab2"]
    assert lab2 and all(r["ok"] and r["note"] == "rolled back to 0.32.0-cpu" for r in lab2)
    assert "/opt/vllm/models/tiny-llama/" in on("lab2", "cat /etc/vllm/default.yaml")
    status, body = api_get("lab2", "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny-llama"
    assert state("lab2")["current"]["files"] == good["files"]


def test_controller_killed_during_install_leaves_the_old_release_current_and_a_rerun_converges(baseline):
    # the install must happen in this test: a 0.31.0 left by an earlier session would be reused
    on("lab1", "test \"$(readlink /opt/vllm/current)\" = releases/0.31.0-cpu || "
               "rm -rf /opt/vllm/releases/0.31.0-cpu")
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps({"lab1": {"version": "0.31.0"}}),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([PYINFRA, "-y", "--limit", "lab1", INVENTORY, "deploys/vllm.py"], cwd=ROOT,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    deadline = time.monotonic() + 900
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "Starting operation:" in line and "build release 0.31.0-cpu" in line:
            time.sleep(3)
            proc.send_signal(signal.SIGKILL)
            break
        assert time.monotonic() < deadline, "".join(seen[-20:])
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-30:])
    assert on("lab1", "readlink /opt/vllm/current").strip() == "releases/0.32.0-cpu"
    releases = on("lab1", "ls -1 /opt/vllm/releases").split()
    assert "0.32.0-cpu" in releases
    # complete or absent: a 0.31.0 directory exists only once its install finished
    if "0.31.0-cpu" in releases:
        assert on("lab1", "test -x /opt/vllm/releases/0.31.0-cpu/bin/vllm && echo ok").strip() == "ok"
    status, _ = api_get("lab1", "/v1/models")
    assert status == 200  # the old service never stopped

    run = deploy(overrides={"lab1": {"version": "0.31.0"}}, limit="lab1")
    assert run.rc == 0, run.output[-4000:]
    assert on("lab1", "readlink /opt/vllm/current").strip() == "releases/0.31.0-cpu"
    assert [r["release"] for r in run.smoke if r["ok"]] == ["0.31.0-cpu"]
    assert json.loads(api_get("lab1", "/version")[1])["version"].startswith("0.31.0")


def test_rollback_returns_to_the_previous_release_and_a_second_rollback_toggles(baseline):
    assert state("lab1")["current"]["release"] == "0.31.0-cpu"
    run = deploy("deploys/rollback.py", limit="lab1")
    assert run.rc == 0, run.output[-4000:]
    assert on("lab1", "readlink /opt/vllm/current").strip() == "releases/0.32.0-cpu"
    assert json.loads(api_get("lab1", "/version")[1])["version"].startswith("0.32.0")
    assert [r["note"] for r in run.smoke] == ["rolled back to 0.32.0-cpu"]
    assert all(r["ok"] for r in run.smoke)

    run = deploy("deploys/rollback.py", limit="lab1")
    assert run.rc == 0, run.output[-4000:]
    assert on("lab1", "readlink /opt/vllm/current").strip() == "releases/0.31.0-cpu"

    run = deploy()  # back to the inventory's release for the tests that follow
    assert run.rc == 0, run.output[-4000:]
    assert on("lab1", "readlink /opt/vllm/current").strip() == "releases/0.32.0-cpu"


def test_rollback_without_previous_state_is_refused_and_changes_nothing(baseline):
    on("lab2", "mv /var/lib/vllm-fleet/state.json /var/lib/vllm-fleet/state.json.aside && "
               "python3 -c 'import json; s=json.load(open(\"/var/lib/vllm-fleet/state.json.aside\")); "
               "s.pop(\"previous\", None); json.dump(s, open(\"/var/lib/vllm-fleet/state.json\", \"w\"))'")
    try:
        before = unit_props("lab2")
        run = deploy("deploys/rollback.py")
        assert run.rc != 0
        assert "lab2: nothing to roll back to: no previous deploy is recorded" in run.output
        assert "Beginning operation run" not in run.output
        assert unit_props("lab2")["MainPID"] == before["MainPID"]
    finally:
        on("lab2", "mv /var/lib/vllm-fleet/state.json.aside /var/lib/vllm-fleet/state.json")
