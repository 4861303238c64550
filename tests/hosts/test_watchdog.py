"""A hung engine on a real lab host: /health keeps answering 200, the watchdog restarts the instance.

The engine core of lab1's vLLM (the process vLLM titles `VLLM::EngineCore`, not the API server) is
frozen with SIGSTOP, which is what a deadlocked engine looks like from outside: the API server answers
/health (it only reports an engine it has noticed die) while every completion waits.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.hosts.conftest import deploy, on

FAST = {"interval_s": 3, "timeout_s": 5, "failures": 2}
BOUND = FAST["failures"] * (FAST["interval_s"] + FAST["timeout_s"])
STATE = "/var/lib/vllm-watchdog-default/state.json"


def props(host: str) -> dict[str, str]:
    text = on(host, "systemctl show vllm-default.service -p InvocationID -p MainPID -p ActiveState")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def completion(host: str, timeout_s: float) -> str:
    """POST /v1/completions on the host's loopback with the key from the env file: the status, or
    'timeout'."""
    script = (
        "import json, sys, urllib.request, urllib.error\n"
        "env = dict(l.split('=', 1) for l in open('/etc/vllm/default.env') if '=' in l)\n"
        "key = env['VLLM_API_KEY'].strip().strip(chr(34))\n"
        "body = json.dumps({'model': 'tiny-llama', 'prompt': 'hi', 'max_tokens': 1}).encode()\n"
        "req = urllib.request.Request('http://127.0.0.1:8000/v1/completions', data=body, headers={\n"
        "    'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})\n"
        "try:\n"
        f"    print(urllib.request.urlopen(req, timeout={timeout_s}).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
        "except Exception as e:\n    print('timeout' if 'timed out' in str(e) else repr(e))\n"
    )
    return on(host, "python3 -", stdin=script).strip()


def health(host: str) -> str:
    return on(host, "curl -s -o /dev/null -m 5 -w '%{http_code}' http://127.0.0.1:8000/health").strip()


def wait_for(what: str, check, timeout_s: float, step: float = 0.5):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        value = check()
        if value:
            return value
        time.sleep(step)
    pytest.fail(f"not within {timeout_s:.0f} s: {what}")


@pytest.fixture(scope="module")
def fast_watchdog(deployed):
    base = deploy(limit="lab1")  # the lab's own settings first: earlier tests may have left others
    assert base.rc == 0, base.output[-4000:]
    before = props("lab1")
    run = deploy(overrides={"lab1": {"watchdog": FAST}}, limit="lab1")
    assert run.rc == 0, run.output[-4000:]
    yield run, before
    back = deploy(limit="lab1")  # the lab's own settings again
    assert back.rc == 0, back.output[-4000:]


def test_watchdog_settings_change_without_restarting_vllm(fast_watchdog):
    run, before = fast_watchdog
    assert props("lab1")["MainPID"] == before["MainPID"]
    changed = run.changed_ops()
    assert any("watchdog vllm-watchdog@default.timer" in op for op in changed), changed
    assert not any(op.startswith("restart vllm-") for op in changed), changed
    timer = on("lab1", "systemctl show vllm-watchdog@default.timer -p ActiveState -p UnitFileState")
    assert "ActiveState=active" in timer and "UnitFileState=enabled" in timer


def test_a_frozen_engine_is_restarted_within_the_bound_while_health_says_200(fast_watchdog):
    first = props("lab1")
    # armed: the probe has seen this invocation serve
    wait_for("the watchdog's first successful probe", lambda: (
        (s := json.loads(on("lab1", f"cat {STATE} 2>/dev/null") or "{}")).get("armed")
        and s.get("invocation") == first["InvocationID"]), 60)
    # the API server's child that vLLM titles VLLM::EngineCore (setproctitle)
    engine = on("lab1", f"ps -o pid=,args= --ppid {first['MainPID']} | awk '$2 ~ /^VLLM::EngineCore/ "
                        "{print $1}'").split()
    assert len(engine) == 1, f"one engine core process under vLLM's main process: {engine}"
    on("lab1", f"kill -STOP {engine[0]}")
    frozen = time.monotonic()

    # the lie: /health is fine, a completion is not
    assert health("lab1") == "200"
    assert completion("lab1", 4) == "timeout"
    assert health("lab1") == "200"

    restarted = wait_for("the watchdog restarting vllm-default.service", lambda: (
        props("lab1").get("InvocationID") not in ("", first["InvocationID"])),
        BOUND + FAST["interval_s"] + 30)
    detected = time.monotonic() - frozen
    assert restarted
    wait_for("a completion after the restart", lambda: completion("lab1", 10) == "200", 300, step=2)
    serving = time.monotonic() - frozen
    print(f"watchdog: frozen engine detected and restarted after {detected:.0f} s "
          f"(bound {BOUND} s + one interval), serving again after {serving:.0f} s")
    assert detected <= BOUND + FAST["interval_s"] + 10

    log = on("lab1", "journalctl -u vllm-watchdog@default.service --no-pager -o cat")
    assert "probes failed in a row" in log and "restarting the instance" in log, log[-2000:]
    status = deploy("deploys/smoke.py", limit="lab1")
    assert status.rc == 0, status.output[-4000:]
    assert [r["ok"] for r in status.smoke] == [True]
