"""What one pyinfra run learns across its hosts, kept on that run's State, not in module globals.

pyinfra collects every host before it executes anything, and some decisions need the other hosts: the
inventory is validated once for all of them, a node group's workers wait for their head's verdict, a
node restarts when another node of its group changed. Kept on the State, two runs in one process (the
Python API, a test) never see each other's hosts, and the tables a run prints come out once, after
pyinfra's own results, when the run disconnects its hosts (a CLI run always does; an API caller that
runs `disconnect_all` gets them too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.context import ctx_state

if TYPE_CHECKING:
    from pyinfra.api.host import Host

    from vllm_fleet.controller.hub import HubError
    from vllm_fleet.controller.smoke import SmokeResult
    from vllm_fleet.core.cluster import NodeRole
    from vllm_fleet.core.hostfacts import HubCacheFacts, LoginFacts, ManifestFacts
    from vllm_fleet.core.hub import HubSnapshot
    from vllm_fleet.core.lb import Balancer
    from vllm_fleet.core.spec import HostSpec

OUTCOME_ENV = "VLLM_FLEET_RUN_JSON"  # where a run writes its outcome (FleetRun.summary), if set
DRY_ATTR = "_vllm_fleet_dry"  # set on the State by controller/runner.py for a dry run: it holds no lease


class HostLease(Protocol):
    """A host lease this run holds (vllm_fleet.roles.lease.Held): what the run's other steps ask of it."""

    token: str

    def ask(self, what: str, until: tuple[str, ...]) -> str: ...

    def release(self) -> bool: ...


@dataclass
class FleetRun:
    specs: dict[str, HostSpec] | None = None  # host -> its spec, the whole inventory validated once
    secrets_found: bool = False  # every host's secret variables are set (checked once it passes)
    skipped: list[str] = field(default_factory=list)  # hosts without vllm data
    nodes: dict[str, NodeRole] = field(default_factory=dict)  # host -> its place in a node group
    logins: dict[str, LoginFacts] = field(default_factory=dict)  # host -> LoginAccess fact
    manifests: dict[tuple[str, tuple[str, ...]], ManifestFacts] = field(default_factory=dict)  # (host, paths)
    results: list[SmokeResult] = field(default_factory=list)  # every host's smoke results
    # node group (NodeRole.store) -> what its head decided: "ok", "rollback" or "failed"
    outcome: dict[str, str] = field(default_factory=dict)
    # node group (NodeRole.store) -> node -> what its plan starts (cluster.shape), for cluster.disagreements
    shapes: dict[str, dict[str, dict[str, object]]] = field(default_factory=dict)
    # node group -> some node's files changed in this run; read when the operations execute
    cluster_changed: dict[str, bool] = field(default_factory=dict)
    balancers: dict[str, Balancer] | None = None  # host -> its load balancer, validated once
    # a report's rows (a list, or a dict by host), each report's own type, by report name
    rows: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # host -> why the deploy failed it
    # host -> its failed smoke test, for the rollback operation after it (smoke.ChangeFailed: a change)
    verdicts: dict[str, Exception] = field(default_factory=dict)
    # (endpoint, repo, revision, token variable) -> the snapshot or why not, asked once per run
    hub: dict[tuple[str, str, str, str | None], HubSnapshot | HubError] = field(default_factory=dict)
    hub_caches: dict[tuple[str, str], HubCacheFacts] = field(default_factory=dict)  # (host, snapshot)
    leases: dict[str, HostLease] = field(default_factory=dict)  # host -> this run's host lease
    _at_end: dict[str, Callable[[], None]] = field(default_factory=dict)
    _printed: bool = False

    def at_end(self, name: str, printer: Callable[[], None]) -> bool:
        """Run `printer` once, when this run has disconnected its hosts. True for the first registration
        of `name` (the one that counts), so a caller can do a once-per-run step beside it."""
        if name in self._at_end:
            return False
        self._at_end[name] = printer
        return True

    def fail(self, host_name: str, error: BaseException) -> None:
        """Why a host failed, in the deploy's words (first line), for the run's outcome."""
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if ln.startswith(f"{host_name}:")), lines[0] if lines else "")
        self.failures.setdefault(host_name, reason)

    def summary(self, state: State) -> dict[str, Any]:
        """Each host of the run (the limit's): whether it connected, whether it failed and why, and the
        smoke results; what `vllm-fleet rollout` reads instead of pyinfra's printed output, and what a
        plain `pyinfra` run writes to $VLLM_FLEET_RUN_JSON for a caller outside this process."""
        connected = {h.name for h in state.activated_hosts}
        failed = {h.name for h in state.failed_hosts}
        hosts = {h.name: {"connected": h.name in connected,
                          "failed": h.name in failed or h.name in self.failures,
                          "reason": self.failures.get(h.name, "")}
                 for h in state.inventory if state.is_host_in_limit(h)}
        return {"hosts": hosts, "smoke": [r.as_dict() for r in self.results]}

    def finish(self, state: State | None = None) -> None:
        if self._printed:
            return
        self._printed = True
        out = os.environ.get(OUTCOME_ENV)
        if out and state is not None:
            with open(out, "w") as f:
                json.dump(self.summary(state), f, indent=2)
        for printer in reversed(self._at_end.values()):  # last registered first, as atexit did
            try:
                printer()
            except Exception as e:  # a report must not hide the run's own outcome
                logger.warning(f"vllm-fleet: printing the {printer.__name__} report failed: {e}")


class _Finish(BaseStateCallback):
    """The last activated host's disconnect ends the run: print what the run collected."""

    def __init__(self, run: FleetRun):
        self.run = run
        self.waiting: set[str] | None = None

    # pyinfra declares its callbacks static, but calls them on the handler it was given
    # (State.trigger_callbacks: getattr(handler, name)(state, ...)): a method gets the same call
    def host_disconnect(self, state: State, host: Host) -> None:  # type: ignore[override]
        if self.waiting is None:
            self.waiting = {h.name for h in state.activated_hosts}
        self.waiting.discard(host.name)
        if not self.waiting:
            self.run.finish(state)


def current() -> FleetRun:
    """This run's state, made on first use (collection is concurrent, but greenlets switch only on
    I/O, so two hosts cannot both make one)."""
    state = ctx_state.get()
    run = getattr(state, "_vllm_fleet_run", None)
    if run is None:
        run = FleetRun()
        state._vllm_fleet_run = run
        state.add_callback_handler(_Finish(run))
    return run
