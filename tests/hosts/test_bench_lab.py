"""A benchmark sweep's trial server is the same untrusted vLLM as the serving unit, so on a real lab host
its transient unit must run with the serving unit's sandbox: systemd itself reports each property of
both units while the trial serves, and they must be equal. The trial must also really serve (its bench
row has a result), and the serving unit is left untouched.
"""

from __future__ import annotations

import threading
import time

from tests.hosts.conftest import deploy, on, unit_props
from vllm_fleet.core import render
from vllm_fleet.core.render import _CONFINING

TRIAL = "vllm-bench-trial-default.service"


def _keys() -> list[str]:
    """What confines vLLM's unit: every key of the shared hardening and the unit's own device, path and
    network lines; User too (a trial as root would make the rest moot)."""
    lines = render.environment().get_template("sandbox.j2").render().splitlines()
    keys = {line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("{#")}
    return sorted(keys | set(_CONFINING) | {"User"})


def _show(unit: str, keys: list[str]) -> dict[str, str]:
    text = on("lab1", f"systemctl show {unit} -p ActiveState " + " ".join(f"-p {k}" for k in keys))
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_a_sweep_trial_serves_in_the_serving_units_sandbox(deployed):
    keys = _keys()
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def watch() -> None:  # the trial lives for its start-up and one short bench: catch it while active
        while not done.is_set() and not seen:
            props = _show(TRIAL, keys)
            if props.get("ActiveState") == "active":
                seen.append(props)
            time.sleep(0.5)

    pid = unit_props("lab1")["MainPID"]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = deploy("deploys/bench.py", limit="lab1",
                     env={"VLLM_FLEET_BENCH_SWEEP_MULTIPLES": "1", "VLLM_FLEET_BENCH_NUM_PROMPTS": "4"})
    finally:
        done.set()
        watcher.join(timeout=30)
    assert run.rc == 0, run.output[-4000:]
    assert seen, "the trial unit was never seen active: " + run.output[-3000:]
    trial = {k: v for k, v in seen[0].items() if k != "ActiveState"}
    serving = {k: v for k, v in _show("vllm-default.service", keys).items() if k != "ActiveState"}
    differ = {k: (trial.get(k), serving.get(k)) for k in keys if trial.get(k) != serving.get(k)}
    assert trial == serving, differ
    assert serving["User"] == "vllm" and serving["ProtectSystem"] == "strict", serving

    rows = [line for line in run.output.splitlines() if "trial max-num-batched-tokens" in line]
    assert rows and "did not start" not in rows[0] and "not ready" not in rows[0], run.output[-3000:]
    assert "MainPID" in run.output and "untouched" in run.output, run.output[-3000:]
    assert unit_props("lab1")["MainPID"] == pid
    assert _show(TRIAL, ["User"])["ActiveState"] == "inactive"  # stopped: nothing left running
