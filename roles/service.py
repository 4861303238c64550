"""Config, env file and unit for one instance; restart only when one of them (or the release) changed."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import TypedDict

from pyinfra import host, logger
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.operations import files, python, server, systemd

from vllm_fleet.controller.run import current
from vllm_fleet.core import render
from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.hub import TOKEN_SUFFIX
from vllm_fleet.core.layout import STAGED
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.roles.ops import Content, Secret, marker_path, stale, synced_files


def staged_environment(inst: InstancePlan) -> str:
    """The validator's environment: the unit's settings file as it will be, without the secrets' file.
    vLLM reads settings from it while building its config (VLLM_ENABLE_V1_MULTIPROCESSING decides
    whether the CPU platform keeps the "uni" executor)."""
    return f"{STAGED}/{inst.name}.environment"


def instance_paths(inst: InstancePlan) -> tuple[str, ...]:
    """Every file of an instance, compared in one remote command."""
    return (inst.config_path, inst.env_path, inst.environment_path, f"/etc/systemd/system/{inst.unit}",
            inst.hub_token_path,
            f"{STAGED}/{inst.name}.yaml", staged_environment(inst), validated_path(inst),
            *(f"/etc/systemd/system/{u}" for u in inst.watchdog_units))


def validated_path(inst: InstancePlan) -> str:
    return f"{STAGED}/{inst.name}.validated"


def validation_marker(plan: HostPlan, inst: InstancePlan, lock: str) -> bytes:
    """What a passed validation leaves beside the staged config: the release and its lock, the
    validator's own code, and the digests of what it read and where it ran (the unit's sandbox). A later
    run where all are the same (a deploy after `vllm-fleet stage`) does not validate again; a release
    rebuilt from another lock, a changed sandbox, or a vllm-fleet whose validator changed, does."""
    config = hashlib.sha256(render.serve_config(plan, inst).encode()).hexdigest()
    environment = hashlib.sha256(render.environment_file(inst).encode()).hexdigest()
    sandbox = hashlib.sha256("\n".join(render.validator_properties(plan, inst)).encode()).hexdigest()[:16]
    return f"{plan.release} lock {lock} validator {_VALIDATOR} {config} {environment} {sandbox}\n".encode()


def _validator_digest() -> str:
    from vllm_fleet.roles.install import HOST_SRC

    h = hashlib.sha256()
    for name in ("validate_serve.py", "effective.py", "validate_in_unit.py"):
        h.update((HOST_SRC / name).read_bytes())
    return h.hexdigest()[:16]


_VALIDATOR = _validator_digest()


def validated(inst: InstancePlan, marker: bytes) -> bool:
    return not stale([(marker, validated_path(inst))], "root", "root", "600", instance_paths(inst))


def restart_command(unit: str) -> str:
    """A deliberate restart is not a crash loop: reset systemd's start-rate counter first, so a
    busy day of changes (StartLimitBurst in the unit) never refuses one."""
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl restart {unit}"


def stage_config(plan: HostPlan, inst: InstancePlan, release_changing: bool) -> bool:
    """Put the rendered config aside for validation when the live one, the unit or the release would
    change; True then (the caller validates). The env file counts because the environment it holds is
    part of what vLLM builds its config from. The staged copy is refreshed whenever it differs, so a
    validation never reads an older config."""
    content = render.serve_config(plan, inst).encode()
    unit = render.unit(plan, inst).encode()
    env = Secret(render.env_file(inst, os.environ))
    environment = render.environment_file(inst).encode()
    paths = instance_paths(inst)
    if not (stale([(content, inst.config_path)], "root", "root", "644", paths)
            or stale([(unit, f"/etc/systemd/system/{inst.unit}")], "root", "root", "644", paths)
            or stale([(env, inst.env_path)], "root", "root", "600", paths)
            or stale([(environment, inst.environment_path)], "root", "root", "600", paths)
            or release_changing):
        return False
    # the validator's environment as a file systemd reads, so no value reaches an argv
    staged = [(content, f"{STAGED}/{inst.name}.yaml"), (environment, staged_environment(inst))]
    if stale(staged, "root", "root", "600", paths):
        synced_files(name=f"staged config {inst.name}", files=staged, mode="600", paths=paths)
    return True


def remove(unit: str, watchdogs: Mapping[str, Mapping[str, str]]) -> list:
    """An instance gone from the inventory: stop and disable its unit and its watchdog, remove their
    files, and say so. The watchdog goes first, so it never restarts what is being removed."""
    name = unit.removeprefix("vllm-").removesuffix(".service")
    logger.warning(f"[{host.name}] instance {name} is no longer in the inventory: removing {unit}")
    ops = remove_watchdog(name, watchdogs, why=f"instance {name} left the inventory")
    ops.append(systemd.service(name=f"stop and disable {unit} (instance {name} left the inventory)",
                               service=unit, running=False, enabled=False))
    first = len(ops)
    for path in (f"/etc/systemd/system/{unit}", f"/etc/vllm/{name}.yaml", f"/etc/vllm/{name}.env",
                 f"/etc/vllm/{name}{TOKEN_SUFFIX}", marker_path(f"/etc/vllm/{name}{TOKEN_SUFFIX}"),
                 f"/etc/vllm/{name}.environment", marker_path(f"/etc/vllm/{name}.env"),
                 f"{STAGED}/{name}.yaml", f"{STAGED}/{name}.environment", f"{STAGED}/{name}.environment.json",
                 f"{STAGED}/{name}.yaml.at-default", f"{STAGED}/{name}.yaml.routes.json",
                 f"{STAGED}/{name}.validated"):
        ops.append(files.file(name=f"remove {path}", path=path, present=False))
    systemd.daemon_reload(name="systemd daemon-reload (instance removed)", _if=ops[first].did_change)
    return ops


def remove_watchdog(name: str, watchdogs: Mapping[str, Mapping[str, str]], why: str) -> list:
    """Stop, disable and delete an instance's watchdog timer and probe unit, if the host has them."""
    timer = f"vllm-watchdog@{name}.timer"
    if timer not in watchdogs:
        return []
    probe = f"vllm-watchdog@{name}.service"
    # the probe too: one in flight could otherwise still restart what is being removed
    ops = [server.shell(name=f"stop and disable {timer} ({why})",
                        commands=[f"systemctl disable --now {timer}; systemctl stop {probe}; "
                                  f"systemctl clean --what=state {probe} 2>/dev/null || true"])]
    for unit in (timer, probe):
        path = f"/etc/systemd/system/{unit}"
        ops.append(files.file(name=f"remove {path}", path=path, present=False))
    return ops


def watchdog(inst: InstancePlan, watchdogs: Mapping[str, Mapping[str, str]]) -> None:
    """The instance's watchdog files, timer enabled and running; a change never restarts vLLM."""
    timer = inst.watchdog_units[1]
    if inst.watchdog is None:
        if remove_watchdog(inst.name, watchdogs, why="watchdog turned off"):
            server.shell(name="systemd daemon-reload (watchdog removed)",
                         commands=["systemctl daemon-reload"])
        return
    contents = render.watchdog_units(inst)
    wanted = [(c.encode(), f"/etc/systemd/system/{u}")
              for c, u in zip(contents, inst.watchdog_units, strict=True)]
    paths = instance_paths(inst)
    changed = bool(stale(wanted, "root", "root", "644", paths))
    if changed:
        synced_files(name=f"watchdog {timer}", files=wanted, paths=paths)
        server.shell(name="systemd daemon-reload (watchdog)", commands=["systemctl daemon-reload"])
    now = watchdogs.get(timer, {})
    if changed or now.get("UnitFileState") != "enabled" or now.get("ActiveState") != "active":
        server.shell(name=f"start {timer}",
                     commands=[f"systemctl enable {timer} && systemctl restart {timer}"])


def restarts(changed: bool, state: dict[str, str]) -> bool:
    """Whether configure() restarts the unit: its files changed, or it was not running."""
    return changed or state.get("ActiveState") != "active"


def configure(plan: HostPlan, inst: InstancePlan, release_or_model_changed: bool,
              state: dict[str, str], before_restart: Callable[[], None] = lambda: None) -> bool:
    """Write the live files; daemon-reload, enable and restart only as needed. True when the instance
    changed (files, release or model): what the run commits and can roll back. A unit that was not
    running is restarted too without counting as a change (`restarts`).

    Every decision is made here, at collection time, from two facts (a manifest of the files and the
    unit's `state`, from the host fact the caller read: pyinfra 3 does not cache facts, so a second
    get_fact would be a second remote command), so a converged host costs two remote commands.
    """
    config = [(render.serve_config(plan, inst).encode(), inst.config_path)]
    env: list[tuple[Content, str]] = [(Secret(render.env_file(inst, os.environ)), inst.env_path),
           (render.environment_file(inst).encode(), inst.environment_path)]
    unit = [(render.unit(plan, inst).encode(), f"/etc/systemd/system/{inst.unit}")]
    paths = instance_paths(inst)
    stale_config = bool(stale(config, "root", "root", "644", paths))
    stale_env = bool(stale(env, "root", "root", "600", paths))
    stale_unit = bool(stale(unit, "root", "root", "644", paths))
    changed = stale_config or stale_env or stale_unit or release_or_model_changed
    if stale_config:
        synced_files(name=f"serve config {inst.config_path}", files=config, paths=paths)
    if stale_env:
        synced_files(name=f"env files {inst.environment_path}, {inst.env_path} (0600)", files=env, mode="600",
                     paths=paths)
    if stale_unit:
        synced_files(name=f"unit {inst.unit}", files=unit, paths=paths)
        server.shell(name="systemd daemon-reload", commands=["systemctl daemon-reload"])
    if state.get("UnitFileState") != "enabled":
        server.shell(name=f"enable {inst.unit}", commands=[f"systemctl enable {inst.unit}"])
    if restarts(changed, state):
        before_restart()  # a load balancer drains the host first (roles/lb.py)
        server.shell(name=f"restart {inst.unit}" + (" (changed)" if changed else " (was not running)"),
                     commands=[restart_command(inst.unit)])
    elif inst.node is not None:
        # A node group forms only with every node on the new config: a change on one node restarts all.
        group = inst.node.store
        changed_groups = current().cluster_changed  # read when the operations execute: every node collected
        server.shell(name=f"restart {inst.unit} (if another node of cluster {inst.node.cluster} changed)",
                     commands=[restart_command(inst.unit)],
                     _if=lambda: changed_groups.get(group, False))
    if inst.node is not None and changed:
        current().cluster_changed[inst.node.store] = True
    return changed


class _When(TypedDict, total=False):
    """An operation's condition, where it has one (pyinfra's own default otherwise)."""

    _if: Callable[[], bool]


def group_barrier(node: NodeRole, changed: bool) -> None:
    """Before a node switches, writes or restarts anything: every node of its group must have staged and
    validated. Without it a head restarted into the group while a worker had failed its validation,
    and waited out its ready timeout for a peer that never came. Only where this node changes, or
    another node's change would restart it."""
    group, changed_groups = node.store, current().cluster_changed
    when: _When = {} if changed else {"_if": lambda: changed_groups.get(group, False)}
    python.call(name=f"every node of cluster {node.cluster} passed its checks", function=group_intact,
                nodes=node.nodes, cluster=node.cluster, **when)


def group_intact(state: State, host: Host, nodes: tuple[str, ...], cluster: str) -> bool:
    """pyinfra runs each operation on every host before the next, so when this runs every node of the
    group has been through its own checks: a node that failed them fails this one too."""
    failed = sorted(h.name for h in state.failed_hosts if h.name in nodes and h.name != host.name)
    if failed:
        host.log_styled(f"not changed: node(s) {', '.join(failed)} of cluster {cluster} failed before the "
                        "restart, so the group cannot form on the new config", fg="red",
                        log_func=logger.error)
        return False
    return True
