"""The vLLM deploy: validate the whole inventory, plan each host from its facts, apply, smoke-test.

pyinfra runs this once per host while collecting operations, before executing any of them; the
inventory-wide validation runs on the first call, so a bad value on the last host stops the deploy
before the first host is touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pyinfra import host, inventory, logger
from pyinfra.api.exceptions import PyinfraError

from fleet.plan import HostFacts, HostPlan, missing_secrets, plan_host
from fleet.spec import HostSpec, SpecError, parse_inventory
from roles import install, model, service
from roles.facts import VllmHost
from roles.smoke import verify_op


class Refused(PyinfraError):
    """Bad input or an unfit host: pyinfra prints the message without a traceback and exits non-zero."""


_SPECS: dict[str, HostSpec] | None = None


def inventory_specs() -> dict[str, HostSpec]:
    global _SPECS
    if _SPECS is None:
        try:
            specs = parse_inventory(
                (h.name, h.data.get("vllm"), h.data.get("vllm_defaults")) for h in inventory
            )
        except SpecError as e:
            raise Refused("inventory refused, nothing was changed:\n  " + "\n  ".join(e.problems)) from None
        missing = [p for name, spec in specs.items() for inst in spec.instances
                   for p in missing_secrets(name, inst, os.environ)]
        if missing:
            raise Refused("refused, nothing was changed:\n  " + "\n  ".join(missing))
        _SPECS = specs
    return _SPECS


def _model_configs(spec: HostSpec) -> dict[str, dict[str, Any]]:
    """config.json of staged models, read on the controller (heads for the tensor-parallel rule)."""
    out = {}
    for inst in spec.instances:
        if inst.model.path:
            cfg = Path(inst.model.path) / "config.json"
            if not cfg.exists():
                raise Refused(f"{host.name}: vllm.instances[{inst.name}].model.path: {cfg} does not exist "
                              "on the controller")
            out[inst.name] = json.loads(cfg.read_text())
    return out


def host_facts(spec: HostSpec) -> tuple[HostFacts, dict[str, Any]]:
    vh = host.get_fact(VllmHost)
    gpus: tuple = ()
    driver = problem = None
    if spec.accelerator == "cuda":
        from roles.nvidia_facts import NvidiaGpus

        nv = host.get_fact(NvidiaGpus)
        gpus, driver, problem = tuple(nv["gpus"]), nv["driver"], nv["problem"]
    return HostFacts(gpus=gpus, driver=driver, nvidia_problem=problem,
                     cpu_flags=frozenset(vh["cpu_flags"])), vh


def plan_this_host() -> tuple[HostPlan, dict[str, Any]]:
    spec = inventory_specs()[host.name]
    facts, vh = host_facts(spec)
    try:
        plan = plan_host(host.name, spec, facts, os.environ, _model_configs(spec))
    except SpecError as e:
        raise Refused("refused, nothing was changed:\n  " + "\n  ".join(e.problems)) from None
    for w in plan.warnings:
        logger.warning(w)
    return plan, vh


def deploy_vllm() -> None:
    """Install aside, validate with the new vLLM, then switch and restart; smoke or roll back."""
    plan, vh = plan_this_host()
    install.base()
    built = install.release(plan, vh["releases"])
    release_changing = vh["current"] != plan.release
    staged_models = []
    for inst in plan.instances:
        staged_models.append(model.stage(inst))
        staged = service.stage_config(plan, inst)

        def must_validate(staged=staged) -> bool:
            return release_changing or staged.did_change() or (built is not None and built.did_change())

        install.validate(plan, inst, f"{service.STAGED}/{inst.name}.yaml", when=must_validate)
    switched = install.switch(plan, vh["current"])
    changes = [service.configure(plan, inst, also_changed=[switched, *staged_models[i]])
               for i, inst in enumerate(plan.instances)]
    verify_op(plan, changed=lambda: any(c() for c in changes), had_state=bool(vh["state"]))


def smoke_only() -> None:
    plan, _ = plan_this_host()
    verify_op(plan, changed=lambda: False, wait=False)
