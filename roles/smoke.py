"""Wait until an instance is ready, then smoke-test it through real HTTP from the controller."""

from __future__ import annotations

import atexit
import json
import os
import sys

from pyinfra import host, logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import python

from fleet import smoke
from fleet.plan import HostPlan, InstancePlan
from roles.tunnel import forward

RESULTS: list[smoke.SmokeResult] = []
_registered = False


class SmokeFailed(PyinfraError):
    pass


def _journal(unit: str, lines: int = 25) -> str:
    status, out = host.run_shell_command(f"journalctl -u {unit} -n {lines} --no-pager -o cat")
    return "\n".join(line for line in out.stdout_lines) if status else "(journal unavailable)"


def _unit_crashed(unit: str) -> bool:
    """Failed, or restarted by systemd since the deploy started it: either way it will not get ready."""
    _, out = host.run_shell_command(f"systemctl show {unit} -p ActiveState -p NRestarts")
    props = dict(line.split("=", 1) for line in out.stdout_lines if "=" in line)
    return props.get("ActiveState") == "failed" or props.get("NRestarts", "0") not in ("0", "")


def check(plan: HostPlan, inst: InstancePlan, wait: bool = True) -> None:
    """Bounded readiness wait, then the four checks; a failure fails this host with the journal's tail."""
    api_key = os.environ.get(inst.secret_env["VLLM_API_KEY"]) if inst.api_key_required else None
    result = smoke.SmokeResult(plan.host, inst.name, inst.served_name, inst.tensor_parallel, plan.release)
    with forward(host, inst.host, inst.port) as url:
        if wait:
            ready, waited = smoke.wait_healthy(url, plan.ready_timeout_s,
                                               alive=lambda: not _unit_crashed(inst.unit))
            if not ready:
                result.checks.append(smoke.Check("health", False, f"not ready after {waited:.0f} s"))
                RESULTS.append(result)
                raise SmokeFailed(f"{plan.host}: {inst.unit} did not become ready within {waited:.0f} s; "
                                  f"last journal lines:\n{_journal(inst.unit)}")
            logger.info(f"[{plan.host}] {inst.unit} ready after {waited:.1f} s")
        result.checks = smoke.run_checks(url, inst.served_name, api_key)
    RESULTS.append(result)
    if not result.ok:
        raise SmokeFailed(f"{plan.host}: smoke test of {inst.unit} failed: {result.failures()}")


def _report() -> None:
    if not RESULTS:
        return
    print("\n" + smoke.table(sorted(RESULTS, key=lambda r: (r.host, r.instance))), file=sys.stdout)
    out = os.environ.get("VLLM_FLEET_SMOKE_JSON")
    if out:
        with open(out, "w") as f:
            json.dump([{"host": r.host, "instance": r.instance, "ok": r.ok, "model": r.model,
                        "release": r.release, "tp": r.tp,
                        "checks": [c.__dict__ for c in r.checks]} for r in RESULTS], f, indent=2)


def smoke_op(plan: HostPlan, inst: InstancePlan, wait: bool = True) -> None:
    global _registered
    if not _registered:
        atexit.register(_report)
        _registered = True
    python.call(name=f"smoke test {inst.unit}", function=check, plan=plan, inst=inst, wait=wait)
