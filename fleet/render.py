"""Jinja2 over templates/: the only way unit, env file and serve config are produced.

StrictUndefined so a template that names a field the plan lacks fails on the controller, not as a
half-rendered unit on a host.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path

import jinja2
import yaml

from fleet import lb
from fleet.plan import CURRENT_LINK, HOST_TOOLS, STATE_DIR, HostPlan, InstancePlan

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def _to_yaml(value: object) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")


def envquote(value: str) -> str:
    """systemd EnvironmentFile quoting: double quotes, with backslash and quote escaped."""
    if "\n" in value:
        raise ValueError("a secret value may not contain a newline")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@functools.cache
def environment() -> jinja2.Environment:
    """One per process: Jinja keeps each template compiled in its environment, and a deploy renders
    every unit, config and watchdog at least twice (to compare, then to write)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["to_yaml"] = _to_yaml
    env.filters["envquote"] = envquote
    env.filters["tojson"] = json.dumps
    return env


def unit(plan: HostPlan, inst: InstancePlan) -> str:
    return environment().get_template("vllm.service.j2").render(
        i=inst, gpu=plan.variant != "cpu", current=CURRENT_LINK, state_dir=STATE_DIR,
        ready_timeout_s=plan.ready_timeout_s,
    )


def watchdog_units(inst: InstancePlan) -> tuple[str, str]:
    """(service, timer) file contents of the instance's watchdog; the instance must have one."""
    from fleet.watchdog import RESTART, STATE_NAME, UNIT_STATE

    env = environment()
    args = {"i": inst, "w": inst.watchdog, "state_name": STATE_NAME.format(inst.name),
            "script": f"{HOST_TOOLS}/watchdog.py", "restart_status": RESTART,
            "show": f"systemctl show {UNIT_STATE} {inst.unit}"}
    return (env.get_template("vllm-watchdog.service.j2").render(**args),
            env.get_template("vllm-watchdog.timer.j2").render(**args))


def serve_config(plan: HostPlan, inst: InstancePlan) -> str:
    return environment().get_template("vllm-serve.yaml.j2").render(i=inst, host=plan.host)


def haproxy_config(b: lb.Balancer, socket: str) -> str:
    return environment().get_template("haproxy.cfg.j2").render(
        lb=b, socket=socket, backend=lb.BACKEND, key_var=lb.KEY_VAR, body=lb.check_body(b.served_name))


def env_file(inst: InstancePlan, environ: Mapping[str, str]) -> str:
    """The one place secret values are read; only ever written to the host's 0600 env file."""
    secrets = {host_var: environ[ctl_var] for host_var, ctl_var in inst.secret_env.items()}
    return environment().get_template("vllm.env.j2").render(i=inst, secrets=secrets)
