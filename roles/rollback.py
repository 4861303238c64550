"""Roll a host back one step, from the host's own record of what was deployed before.

Nothing comes from the controller's memory: the previous release, config, env file and unit are the
host's snapshot (hoststate.py). Current and previous swap, so a second rollback returns to where the
first started. A host with no previous deploy is refused before any host is touched.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_host
from pyinfra.operations import python

from vllm_fleet.core.plan import HostPlan
from vllm_fleet.roles import lb, lease, smoke
from vllm_fleet.roles.facts import VllmHost
from vllm_fleet.roles.hostplan import Refused, plan_this_host, this_host


def _rollback(state: State, host: Host, plan: HostPlan) -> bool:
    """pyinfra passes (state, host) to a callback that takes them; a failure is reported as the
    deploy's smoke test reports one (kept for the run's record, logged without a traceback)."""
    with ctx_host.use(host):
        try:
            _restore_previous(plan)
        except Exception as e:
            return smoke.report_failure(state, host, e)
    return True


def _restore_previous(plan) -> None:
    release, results = smoke.restore_and_check(plan, "previous")
    logger.info(f"[{host.name}] rolled back to {release}")
    failed = [r for r in results if not r.ok]
    if failed:
        tail = "\n".join(smoke.journal(f"vllm-{r.instance}.service") for r in failed)
        raise smoke.SmokeFailed(f"{host.name}: rolled back to {release} but the smoke test fails: "
                                f"{'; '.join(r.failures() for r in failed)}\n{tail}")


@deploy("vLLM rollback")
def rollback_vllm() -> None:
    """Put the host back one step, on the release and files it last committed before the current ones,
    and smoke-test it. The inventory still declares the change rolled back: the next deploy applies it
    again, so change the inventory before going forward.

    Host data read: ``vllm``, ``vllm_defaults``, ``vllm_lb`` (drained around the restart).
    Environment: the instances' key variables, ``VLLM_FLEET_LEASE_WAIT_S``, ``VLLM_FLEET_LEASE_TTL_S``.

    **Example:**

    .. code:: python

        from vllm_fleet import rollback_vllm

        rollback_vllm()

    ``vllm-fleet rollback inventory.py`` runs it wave by wave.
    """
    spec = this_host()
    if spec is None:
        return
    lease.take("rollback")
    lease.confirm_op()
    state = host.get_fact(VllmHost)["state"] or {}
    if not state.get("previous"):
        raise Refused(f"{host.name}: nothing to roll back to: no previous deploy is recorded on this host "
                      "(nothing was changed on any host)")
    plan, _ = plan_this_host(spec, hub_reads=False)  # the hub may be down: a rollback needs only the host
    smoke.register_report()
    lb.drain_op()  # a rollback restarts too: out of rotation first, back only once it serves
    python.call(name=f"roll back to {state['previous'].get('release')}", function=_rollback, plan=plan)
    lb.ready_op(drains=True)
