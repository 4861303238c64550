"""What every vLLM role shares: the inventory validated once per run, this host's spec and facts, and
its plan, so the deploy, stage, rollback, status, logs, targets, bench and load balancer all decide from
one planning call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyinfra import host, inventory, logger
from pyinfra.api.exceptions import PyinfraError

from vllm_fleet.controller.run import current
from vllm_fleet.core import cluster
from vllm_fleet.core import hub as core_hub
from vllm_fleet.core.environment import missing_secrets
from vllm_fleet.core.hostfacts import VllmHostFacts
from vllm_fleet.core.modelinfo import weight_bytes_from_dir
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.spec import HostSpec, SpecError, is_vllm_host, parse_inventory, skipped_note
from vllm_fleet.core.startup import HostPorts
from vllm_fleet.roles import hub, model, remote
from vllm_fleet.roles.facts import HostModel, VllmHost


class Refused(PyinfraError):
    """Bad input or an unfit host: pyinfra prints the message without a traceback and exits non-zero."""


def inventory_specs(check_secrets: bool = True) -> dict[str, HostSpec]:
    """Every host of the inventory validated, once per run (the first host's collection does it)."""
    run = current()
    if run.specs is None:
        try:
            specs = parse_inventory(
                (h.name, h.data.get("vllm"), h.data.get("vllm_defaults")) for h in inventory
            )
            run.nodes.update(cluster.resolve(specs, {h.name: h.data.get("ssh_hostname") or h.name
                                                     for h in inventory}))
        except SpecError as e:
            raise Refused("inventory refused, nothing was changed:\n  " + "\n  ".join(e.problems)) from None
        run.skipped[:] = [h.name for h in inventory if not is_vllm_host(h.data.get("vllm"))]
        if run.skipped:
            logger.info(f"vllm-fleet: {skipped_note(run.skipped)}")
        run.specs = specs
    # asked by every host (a read-only caller may have parsed the inventory first) and checked until it
    # passes: the check reads every host's instances, so checking again made each host's cost grow with
    # the fleet (bench/controller_scale.py)
    if check_secrets and not run.secrets_found:
        missing = [p for name, spec in run.specs.items() for inst in spec.instances
                   for p in missing_secrets(name, inst, os.environ)]
        if missing:
            raise Refused("refused, nothing was changed:\n  " + "\n  ".join(missing))
        run.secrets_found = True
    return run.specs


def skipped_hosts_note() -> str:
    """The line every vLLM command ends its table with when the inventory has other hosts."""
    skipped = current().skipped
    return f"\n{skipped_note(skipped)}" if skipped else ""


def _model_facts(spec: HostSpec, hub_reads: bool = True) -> tuple[dict[str, dict[str, Any]],
                                                                  dict[str, int | None], dict[str, str],
                                                                  dict[str, Any]]:
    """config.json and weight size of each model (TP rule, memory preflight), a staged model's content
    digest (its host directory), and a hub model's commit: staged models read on the controller,
    host_path models on the host, hub models from the hub at the commit the host will fetch (only when
    `hub_reads`: work that reads what is deployed must not depend on the hub being up)."""
    configs, weights, digests, snapshots = {}, {}, {}, {}
    problems = []
    for inst in spec.instances:
        if inst.model.hf_repo and not hub_reads:
            snapshots[inst.name] = core_hub.unresolved(inst.model.hf_repo, inst.model.revision,
                                                       spec.hf_endpoint)
        elif inst.model.hf_repo:
            try:
                snapshots[inst.name] = hub.resolved(spec, inst)
            except SpecError as e:
                problems.extend(e.problems)
        if inst.model.path:
            cfg = Path(inst.model.path) / "config.json"
            if not cfg.exists():
                raise Refused(f"refused, nothing was changed:\n  {host.name}: vllm.instances[{inst.name}]"
                              f".model.path: {cfg} does not exist on the controller")
            odd = model.odd_names(inst.model.path)
            if odd:
                raise Refused(f"refused, nothing was changed:\n  {host.name}: vllm.instances[{inst.name}]"
                              f".model.path: {inst.model.path} holds file names with control characters "
                              f"({', '.join(odd)}): rename or remove those files")
            configs[inst.name] = json.loads(cfg.read_text())
            weights[inst.name] = weight_bytes_from_dir(inst.model.path)
            digests[inst.name] = model.digest(inst.model.path)
        elif inst.model.host_path:
            found = host.get_fact(HostModel, path=inst.model.host_path)
            if found.get("config"):
                configs[inst.name] = found["config"]
                weights[inst.name] = found.get("weight_bytes")
    if problems:
        raise SpecError(problems)
    return configs, weights, digests, snapshots


def host_facts(spec: HostSpec) -> tuple[HostFacts, VllmHostFacts]:
    vh = host.get_fact(VllmHost)
    gpus: tuple = ()
    rdma: tuple = ()
    driver = problem = health = None
    if spec.accelerator == "cuda":
        from vllm_fleet.roles.nvidia_facts import NvidiaGpus

        nv = host.get_fact(NvidiaGpus)
        gpus, driver, problem, health = tuple(nv["gpus"]), nv["driver"], nv["problem"], nv.get("health")
        rdma = tuple(nv.get("rdma_devices", ()))
    return HostFacts(gpus=gpus, driver=driver, nvidia_problem=problem,
                     cpu_flags=frozenset(vh["cpu_flags"]), interfaces=vh["interfaces"],
                     ip_filtering=vh["ip_filtering"], ports=HostPorts.from_fact(vh),
                     gpu_health=health, units=frozenset(vh.get("units", ())), rdma_devices=rdma), vh


def this_host(check_secrets: bool = True) -> HostSpec | None:
    """This host's spec, its login checked (before any command as root); None for a host that is not
    a vLLM host, which every vLLM deploy then leaves alone."""
    spec = inventory_specs(check_secrets).get(host.name)
    if spec is not None:
        remote.check_login()
    return spec


def _required(spec: HostSpec | None, check_secrets: bool) -> HostSpec:
    spec = spec or this_host(check_secrets)
    if spec is None:
        raise Refused(f"{host.name}: not a vLLM host (no vllm data)")
    return spec


def plan_this_host(spec: HostSpec | None = None, hub_reads: bool = True,
                   group_check: bool = False) -> tuple[HostPlan, VllmHostFacts]:
    """`group_check`: a change is planned (deploy, stage), so a node group's nodes must agree on what
    their facts decide; status and rollback read and restore, and must work on a group that drifted."""
    spec = _required(spec, True)
    facts, vh = host_facts(spec)
    try:
        plan = plan_for(spec, facts, os.environ, hub_reads)
        if group_check:
            agrees_with_group(plan, vh)
    except SpecError as e:
        raise Refused("refused, nothing was changed:\n  " + "\n  ".join(e.problems)) from None
    for w in plan.warnings:
        logger.warning(w)
    return plan, vh


def plan_for(spec: HostSpec, facts: HostFacts, environ: Mapping[str, str],
             hub_reads: bool = True) -> HostPlan:
    """The one planning call every entry point makes (deploy, plan, status, bench); SpecError or Refused.
    Without `hub_reads` a hub model's commit stays unresolved (read-only work: status, rollback)."""
    configs, weights, digests, snapshots = _model_facts(spec, hub_reads)
    plan = plan_host(host.name, spec, facts, environ, configs, weight_bytes=weights,
                     node=current().nodes.get(host.name), model_digests=digests, hub=snapshots)
    refused = hub.disk_refusals(plan) if hub_reads else []
    if refused:
        raise SpecError(refused)
    return plan


def agrees_with_group(plan: HostPlan, vh: VllmHostFacts) -> None:
    """A node's plan against the nodes of its group planned before it in this run: what each node's own
    facts decide (its build, Python, GPUs, dtype) must agree, as the inventory's part already does
    (cluster.resolve). The first node to differ is refused; the others then stop at the group barrier.
    Asked where a change is planned (deploy, stage) and by `vllm-fleet plan`, never by status, rollback
    or the monitoring commands, which must work on a group that drifted."""
    node = current().nodes.get(host.name)
    if node is None or not plan.instances:
        return
    inst = plan.instances[0]
    mine = cluster.shape(plan.release, (vh.get("python") or [""])[0], len(inst.gpu_indexes),
                         inst.tensor_parallel, inst.pipeline_parallel, inst.dtype)
    planned = current().shapes.setdefault(node.store, {})
    problems = cluster.disagreements(node, mine, planned)
    planned[host.name] = mine
    if problems:
        raise SpecError(problems)


def controller_environ(spec: HostSpec) -> dict[str, str]:
    """The environment every command plans with: the controller's own (index settings, find-links, the
    unit's variables), the deploy's exactly. A secret that is not set gets a placeholder, for read-only
    work that never sends it (plan, status, targets, bench); the plan names what is missing instead."""
    secrets = [v for i in spec.instances for v in (i.api_key_env, i.hf_token_env) if v]
    return {**os.environ, **{v: "-" for v in secrets if not os.environ.get(v)}}


def plan_without_secrets(spec: HostSpec | None = None) -> HostPlan:
    """The deploy's own plan for this host, for read-only work that needs no key on the controller."""
    spec = _required(spec, False)
    facts, _ = host_facts(spec)
    try:
        return plan_for(spec, facts, controller_environ(spec), hub_reads=False)
    except SpecError as e:
        raise Refused("refused, nothing was changed:\n  " + "\n  ".join(e.problems)) from None
