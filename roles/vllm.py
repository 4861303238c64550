"""The vLLM deploy: validate the whole inventory, plan each host from its facts, apply, smoke-test.

pyinfra runs this once per host while collecting operations, before executing any of them; the
inventory-wide validation runs on the first call, so a bad value on the last host stops the deploy
before the first host is touched.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import TYPE_CHECKING

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import State
from pyinfra.context import ctx_state
from pyinfra.operations import python, server

from vllm_fleet.controller.run import current
from vllm_fleet.controller.wheels import WheelCacheError
from vllm_fleet.core.environment import missing_secrets
from vllm_fleet.core.hostfacts import VllmHostFacts
from vllm_fleet.core.layout import STAGED
from vllm_fleet.core.lock import LockError
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.core.spec import SpecError, is_vllm_host
from vllm_fleet.core.tables import columns
from vllm_fleet.roles import hub, install, lb, lease, model, remote, service
from vllm_fleet.roles.hostplan import (
    Refused,
    agrees_with_group,
    controller_environ,
    host_facts,
    plan_for,
    plan_this_host,
    skipped_hosts_note,
    this_host,
)
from vllm_fleet.roles.ops import prefetch
from vllm_fleet.roles.smoke import commit_op, verify_op

if TYPE_CHECKING:
    from vllm_fleet.core.report import PlanRow


def validate_staged(plan: HostPlan, inst: InstancePlan, release_changing: bool, lock: str) -> bool:
    """Stage the config when something live would change, and validate it with the release unless
    that exact config, release (and its lock) and validator passed already (`vllm-fleet stage` before
    a maintenance window)."""
    staged = service.stage_config(plan, inst, release_changing)
    marker = service.validation_marker(plan, inst, lock)
    if staged and not service.validated(inst, marker):
        install.validate(plan, inst, f"{STAGED}/{inst.name}.yaml", service.staged_environment(inst),
                         marker, service.validated_path(inst))
    return staged


def release_op(plan: HostPlan, vh: VllmHostFacts) -> OperationMeta | None:
    """The release's build from its lock, or None when the host has it; a lock that cannot be resolved
    or must not be installed is a refusal before this host is touched."""
    try:
        return install.release(plan, vh)
    except WheelCacheError as e:
        raise Refused(f"refused, nothing was changed:\n  {e}") from None


def lock_digest(plan: HostPlan, vh: VllmHostFacts) -> str:
    """The lock of the release a deploy or stage goes to, after release_op: the installed release's own
    (read on the host), else the one its build installs (resolved already, read from the cache)."""
    if plan.release in vh["releases"]:
        return vh["locks"].get(plan.release, "-")
    return install.lock_of(plan, vh).digest


@deploy("vLLM")
def deploy_vllm() -> None:
    """Install aside, validate with the new vLLM, then switch and restart; smoke or roll back.

    What changes is decided here at collection time from the facts, so the plan pyinfra shows is what
    runs, and a converged host costs a handful of remote commands. Every host's data is validated before
    any host is touched; each host is held under its host lease from the first write to the commit.

    Host data read:

    + ``vllm``: the host's declaration (``vllm-fleet explain`` lists every key); ``vllm_defaults`` (group
      data) is deep-merged under it. A host without ``vllm`` data is left alone.
    + ``ssh_user``, ``_sudo`` and the other connection data: a non-root login needs passwordless sudo
    + ``vllm_lb`` on another host: the balancer that drains this one around its restart

    Environment read (the controller's):

    + the variables the inventory names in ``api_key_env`` and ``hf_token_env`` (default
      ``VLLM_API_KEY``): they land on the host only in a 0600 file systemd reads
    + ``VLLM_FLEET_CACHE``: the controller's wheel, lock and model cache (default ``~/.cache/vllm-fleet``)
    + ``VLLM_FLEET_LOCKS``: a folder of reviewed locks to install from (default: under the cache)
    + ``VLLM_FLEET_VARIANT_INDEXES``, ``VLLM_FLEET_FIND_LINKS``: where the builds' wheels come from
    + ``VLLM_FLEET_LEASE_WAIT_S`` (120), ``VLLM_FLEET_LEASE_TTL_S`` (60): how long a run waits for another
      run's host lease, and how long a silent holder keeps it
    + ``VLLM_FLEET_RUN_JSON``, ``VLLM_FLEET_SMOKE_JSON``: files that get the run's outcome and smoke table

    **Example:**

    .. code:: python

        from vllm_fleet import deploy_vllm

        deploy_vllm()

    run as ``pyinfra inventory.py my_deploy.py``, or ``vllm-fleet rollout inventory.py`` for waves.
    """
    try:
        _deploy_vllm()
    except PyinfraError as e:  # a refusal: kept for the run's record, then pyinfra's own handling
        current().fail(host.name, e)
        raise


def _prepared(live: bool = True) -> tuple[HostPlan, VllmHostFacts] | None:
    """This host's plan, its files' state read in one command, and its base (user, directories, uv,
    tools); None for a host that is not a vLLM host. Shared by the deploy and the stage."""
    spec = this_host()
    if spec is None:
        return None
    lease.take("deploy" if live else "stage")  # before any fact: what it plans from is not mid-change
    lease.confirm_op()
    plan, vh = plan_this_host(spec, group_check=True)
    prefetch([tuple(d for _, d in install.tool_files(live)),
              *[tuple(d for _, d in model.files(i)) for i in plan.instances],
              *[service.instance_paths(i) for i in plan.instances]])
    install.base(vh, live=live)
    return plan, vh


def _deploy_vllm() -> None:
    prepared = _prepared()
    if prepared is None:
        return
    plan, vh = prepared
    built = release_op(plan, vh)
    release_changing = vh["current"] != plan.release
    lock = lock_digest(plan, vh)
    model_changed, pending = {}, []
    for inst in plan.instances:
        model_changed[inst.name] = model.stage(inst)
        # the hub's files land before validation reads them; the old service serves meanwhile. A new
        # commit is a new snapshot directory, so the config changes and restarts; a fetch that only
        # repairs the serving snapshot's files restarts nothing
        hub.fetch(plan, inst, service.instance_paths(inst))
        staged = validate_staged(plan, inst, release_changing, lock)
        pending.append(staged or model_changed[inst.name])
    node = current().nodes.get(host.name)
    if node is not None:
        service.group_barrier(node, changed=any(pending) or built is not None)
    install.switch(plan, vh["current"])
    for b, _ in lb.fronting(host.name):  # a load balancer that cannot drain us is refused up front
        problem = remote.login_problem_of(lb.balancer_host(b))
        if problem:
            raise Refused(f"refused, nothing was changed:\n  {host.name}: its load balancer: {problem}")
    drained: list[bool] = []

    def drain_once() -> None:  # before the first restart of this host (several instances, one drain)
        if not drained:
            lb.drain_op()
            drained.append(True)

    changed = [service.configure(plan, inst, release_changing or model_changed[inst.name],
                                 vh["unit_states"].get(inst.unit, {}), before_restart=drain_once)
               for inst in plan.instances]
    for inst in plan.instances:
        service.watchdog(inst, vh["watchdogs"])
    wanted = {inst.unit for inst in plan.instances}
    # only units this toolkit created: another vllm-*.service (someone's vllm-router) is not ours to delete
    created = set(vh.get("created", ()))
    removed = [unit for unit in vh["units"] if unit not in wanted and unit in created]
    for unit in sorted(set(vh["units"]) - wanted - created):
        logger.info(f"[{host.name}] leaving {unit} alone: not in the inventory, and this host's state does "
                    "not say vllm-fleet created it")
    for unit in removed:
        service.remove(unit, vh["watchdogs"])
    # a watchdog whose instance is gone already (a rolled-back new instance, say)
    planned = {inst.name for inst in plan.instances} | {u[len("vllm-"):-len(".service")] for u in removed}
    orphans = [t[len("vllm-watchdog@"):-len(".timer")] for t in vh["watchdogs"]]
    orphans = [name for name in orphans if name not in planned]
    for name in orphans:
        service.remove_watchdog(name, vh["watchdogs"], why=f"instance {name} is gone")
    if orphans:
        server.shell(name="systemd daemon-reload (watchdog removed)", commands=["systemctl daemon-reload"])
    did_change = any(changed) or bool(removed) or built is not None
    had_state = bool(vh["state"])
    lagging = had_state and not did_change and _record_lags(plan, vh)
    if lagging:  # an earlier commit failed (a full file system): record what is live now
        logger.info(f"[{host.name}] the recorded state is not what is live (an earlier commit failed): "
                    "recording it")

    changed_groups = current().cluster_changed

    def this_run_changed() -> bool:  # at execution: another node's change restarts this one too
        return did_change or bool(node and changed_groups.get(node.store))

    possible = did_change or not had_state or node is not None  # else nothing to roll back or commit
    verify_op(plan, changed=this_run_changed, had_state=had_state, planned=did_change or not had_state,
              restarted=frozenset(i.name for i, c in zip(plan.instances, changed, strict=True)
                                  if service.restarts(c, vh["unit_states"].get(i.unit, {}))),
              can_roll_back=possible)
    commit_op(plan, when=lambda: this_run_changed() or not had_state or lagging, possible=possible or lagging)
    # only after the smoke test passed: a host whose change fails stays drained until a deploy passes
    lb.ready_op(drains=bool(drained))


def _record_lags(plan: HostPlan, vh: VllmHostFacts) -> bool:
    """Whether the host's recorded state differs from what is live (release, config, environment or
    unit of an instance), read from the facts the deploy has already: no extra remote command."""
    recorded = (vh["state"] or {}).get("current") or {}
    if recorded.get("release") != vh["current"]:
        return True
    files = recorded.get("files", {})
    for inst in plan.instances:
        have = current().manifests.get((host.name, service.instance_paths(inst)), {})
        for name, path in ((f"{inst.name}.yaml", inst.config_path),
                           (f"{inst.name}.environment", inst.environment_path),
                           (inst.unit, f"/etc/systemd/system/{inst.unit}")):
            live = (have.get(path) or (None,))[0]
            if name in files and live is not None and files[name] != live:
                return True
    return False


@deploy("vLLM stage")
def stage_vllm() -> None:
    """Everything a deploy does before its switch, nothing live touched: the release built from its
    lock, each model staged or fetched, each config validated by that release. What an operator runs
    before a maintenance window; the deploy or rollout after it builds, copies, fetches and validates
    nothing again, and goes straight to the switch and restart.

    Host data and environment read: as ``deploy_vllm`` (secrets too: the validator runs with the unit's
    environment).

    **Example:**

    .. code:: python

        from vllm_fleet import stage_vllm

        stage_vllm()
    """
    try:
        _stage_vllm()
    except PyinfraError as e:
        current().fail(host.name, e)
        raise


def _stage_vllm() -> None:
    prepared = _prepared(live=False)
    if prepared is None:
        return
    plan, vh = prepared
    release_op(plan, vh)
    lock = lock_digest(plan, vh)
    for inst in plan.instances:
        model.stage(inst)
        hub.fetch(plan, inst, service.instance_paths(inst))
        validate_staged(plan, inst, vh["current"] != plan.release, lock)


@deploy("vLLM plan")
def plan_vllm() -> None:
    """Facts and plan only, no operation: one row per host (GPUs, driver, build and why, parallelism,
    dtype, lock), what ``vllm-fleet plan`` prints. Takes no lease and never waits.

    Host data read: ``vllm``, ``vllm_defaults``. Environment: as ``deploy_vllm``; a secret variable that
    is not set is named in the host's row rather than sent anywhere.

    **Example:**

    .. code:: python

        from vllm_fleet import plan_vllm

        plan_vllm()
    """
    from vllm_fleet.core import report

    run = current()
    rows = run.rows.setdefault("plan", [])
    st = ctx_state.get()
    run.at_end("plan", lambda: print("\n" + report.table(sorted(rows + _unreachable_rows(st),
                                                                key=lambda r: r.host))
                                     + skipped_hosts_note()))
    spec = this_host(check_secrets=False)
    if spec is None:
        return
    facts, vh = host_facts(spec)
    row = report.PlanRow(host.name, spec.accelerator, gpus=report.gpu_summary(facts.gpus),
                         driver=str(facts.driver) if facts.driver else "-")
    rows.append(row)
    missing = [p for inst in spec.instances for p in missing_secrets(host.name, inst, os.environ)]
    try:
        if missing:  # checked by name, never shown: the deploy would refuse this host for it
            raise SpecError(missing)
        plan = plan_for(spec, facts, controller_environ(spec))
        agrees_with_group(plan, vh)
    except (SpecError, Refused) as e:
        row.refused = "; ".join(e.problems) if isinstance(e, SpecError) else str(e)
        # an operation that fails without touching the host: pyinfra exits non-zero once every host's
        # refusal is in the table, so a CI gate built on `vllm-fleet plan` stops a bad inventory
        python.call(name="plan refused", function=_refused, reason=row.refused)
        return
    row.variant, row.reason, row.release = plan.variant, plan.variant_reason, plan.release
    row.proof = plan.install_spec.build.proof_line()
    try:
        row.target = install.target(plan, vh).key
        if plan.release in vh["releases"]:
            row.lock, row.install = vh["locks"].get(plan.release, "-"), "installed"
        else:  # the build's own command, from the lock it would install
            lock = install.lock_of(plan, vh)
            row.lock, row.install = lock.digest, shlex.join(install.build_script(plan, lock)[1])
    except (LockError, WheelCacheError) as e:
        row.refused = f"{host.name}: {plan.release}: {e}"
        python.call(name="plan refused", function=_refused, reason=row.refused)
        return
    row.instances = [f"{i.name}: {i.served_name} (TP {i.tensor_parallel}"
                     + (f" x PP {i.pipeline_parallel}" if i.pipeline_parallel > 1 else "") + f", {i.dtype})"
                     + (f" [{i.node.describe()}]" if i.node else "")
                     + (f" from {i.hub.describe()}" if i.hub else "") for i in plan.instances]
    row.warnings = list(plan.warnings)


def _unreachable_rows(st: State) -> list[PlanRow]:
    """A vLLM host pyinfra could not connect to gets its own row; the others are planned all the same."""
    from vllm_fleet.core import report

    reached = {h.name for h in st.activated_hosts}
    return [report.PlanRow(h.name, "-", refused=f"{h.name}: could not connect over SSH (see pyinfra's "
                                                 "connection error above); nothing was planned for it")
            for h in st.inventory if st.is_host_in_limit(h) and h.name not in reached
            and is_vllm_host(h.data.get("vllm"))]


def _refused(state: State, host: Host, reason: str) -> bool:
    """pyinfra calls a callback taking (state, host) for its status: False fails the host, no traceback."""
    host.log_styled(f"refused: {reason}", fg="red", log_func=logger.error)
    return False


@deploy("vLLM status")
def check_vllm() -> None:
    """What the host says is deployed (release, lock, config), its units' state, and a smoke test of
    each instance: ``vllm-fleet status``. Read only: takes no lease and never waits.

    Host data read: ``vllm``, ``vllm_defaults``, ``vllm_lb`` (the balancers' view of each server).
    Environment: the instances' key variables (the smoke test sends the key).

    **Example:**

    .. code:: python

        from vllm_fleet import check_vllm

        check_vllm()
    """
    import hashlib

    run = current()
    status, lb_status = run.rows.setdefault("status", []), run.rows.setdefault("lb status", [])
    tenants = run.rows.setdefault("door tenants", [])
    run.at_end("status", lambda: _print_status(status, lb_status, tenants))
    if host.name in lb.balancers() and lb.balancers()[host.name].spec.tenants:
        python.call(name="front door tenants", function=lambda: tenants.extend(lb.tenant_states()))
    spec = this_host()
    if spec is None:
        return
    plan, vh = plan_this_host(spec, hub_reads=False)
    recorded = (vh["state"] or {}).get("current") or {}
    config_hash = hashlib.sha256(json.dumps(recorded.get("files", {}), sort_keys=True).encode()).hexdigest()
    for inst in plan.instances:
        unit = vh["unit_states"].get(inst.unit, {})
        service = f"{unit.get('ActiveState', '?')}/{unit.get('SubState', '?')}"
        status.append((host.name, inst.name, vh["current"] or "-", recorded.get("release") or "-",
                        recorded.get("lock") or "-", config_hash[:12] if recorded else "-",
                        recorded.get("at", "-"), service, unit.get("MainPID", "-")))
    verify_op(plan, changed=lambda: False, wait=False, live=True)
    if any(b.servers_of(host.name) for b in lb.balancers().values()):
        python.call(name="front door state", function=lambda: lb_status.extend(lb.server_states()))


def _print_status(status: list[tuple[str, ...]], lb_status: list[tuple[str, ...]],
                  tenants: list[tuple[str, ...]]) -> None:
    from vllm_fleet.host.metrics import LIVE_HEAD

    live = {(r.host, r.instance): r.live.cells() for r in current().results if r.live is not None}
    head = ("HOST", "INSTANCE", "CURRENT", "RECORDED", "LOCK", "CONFIG", "DEPLOYED AT", "SERVICE", "PID",
            *LIVE_HEAD)
    rows = [(*row, *live.get((row[0], row[1]), ("-",) * len(LIVE_HEAD))) for row in sorted(status)]
    print("\n" + columns(head, rows) + skipped_hosts_note())
    if lb_status:
        print("\n" + columns(("DOOR", "MODEL", "SERVER", "STATE", "ADMIN", "CHECK", "SESSIONS"),
                              sorted(lb_status)))
    if tenants:
        print("\n" + columns(("DOOR", "TENANT", "REQUESTS/60S", "REQUESTS", "4XX", "TOKENS", "TOKENS/60S"),
                              sorted(tenants)))
