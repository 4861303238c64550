"""Config, env file and unit for one instance; restart only when one of them (or the release) changed."""

from __future__ import annotations

import os
from io import StringIO

from pyinfra import host, logger
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from fleet import render
from fleet.plan import HostPlan, InstancePlan
from roles.ops import Secret, secret_file

STAGED = "/var/lib/vllm-fleet/staged"


def stage_config(plan: HostPlan, inst: InstancePlan):
    """The rendered config, put aside for validation; it changes exactly when the live one will."""
    return files.put(name=f"staged config {inst.name}", src=StringIO(render.serve_config(plan, inst)),
                     dest=f"{STAGED}/{inst.name}.yaml", user="root", group="root", mode="600",
                     create_remote_dir=True)


def remove(unit: str) -> list:
    """An instance gone from the inventory: stop and disable its unit, remove its files, and say so."""
    name = unit.removeprefix("vllm-").removesuffix(".service")
    logger.warning(f"[{host.name}] instance {name} is no longer in the inventory: removing {unit}")
    ops = [systemd.service(name=f"stop and disable {unit} (instance {name} left the inventory)",
                           service=unit, running=False, enabled=False)]
    for path in (f"/etc/systemd/system/{unit}", f"/etc/vllm/{name}.yaml", f"/etc/vllm/{name}.env",
                 f"{STAGED}/{name}.yaml"):
        ops.append(files.file(name=f"remove {path}", path=path, present=False))
    systemd.daemon_reload(name="systemd daemon-reload (instance removed)", _if=ops[1].did_change)
    return ops


def configure(plan: HostPlan, inst: InstancePlan, also_changed: list):
    """Write the live files and restart on change; returns a callable telling whether anything changed."""
    config = files.put(name=f"serve config {inst.config_path}", src=StringIO(render.serve_config(plan, inst)),
                       dest=inst.config_path, user="root", group="root", mode="644")
    env = secret_file(name=f"env file {inst.env_path} (0600)", dest=inst.env_path,
                      content=Secret(render.env_file(inst, os.environ)))
    unit = files.put(name=f"unit {inst.unit}", src=StringIO(render.unit(plan, inst)),
                     dest=f"/etc/systemd/system/{inst.unit}", user="root", group="root", mode="644")
    changed = any_changed(config, env, unit, *[op for op in also_changed if op is not None])
    systemd.daemon_reload(name="systemd daemon-reload", _if=unit.did_change)
    systemd.service(name=f"enable {inst.unit}", service=inst.unit, enabled=True)
    systemd.service(name=f"restart {inst.unit} (changed)", service=inst.unit, restarted=True, _if=changed)
    systemd.service(name=f"{inst.unit} running", service=inst.unit, running=True)
    return changed
