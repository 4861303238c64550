"""Jinja2 over templates/: the only way unit, env file and serve config are produced.

StrictUndefined so a template that names a field the plan lacks fails on the controller, not as a
half-rendered unit on a host.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping
from pathlib import Path

import jinja2
import yaml

from vllm_fleet.core import lb
from vllm_fleet.core.layout import CURRENT_LINK, HOST_TOOLS, STATE_DIR
from vllm_fleet.core.plan import HostPlan, InstancePlan

# the wheel installs the top-level templates/ as vllm_fleet/templates; a checkout reads them where they are
_PACKAGED = Path(__file__).resolve().parent.parent / "templates"
TEMPLATES = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "templates"


def _to_yaml(value: object) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")


def envquote(value: str) -> str:
    """systemd EnvironmentFile quoting: double quotes, with backslash and quote escaped."""
    if not value.isprintable():
        raise ValueError("an environment value may not contain a line break or other control character")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _checked(text: str, what: str) -> str:
    """Belt and braces behind the inventory's checks (vllm_fleet/core/spec.py): systemd and YAML read a NUL, a
    carriage return or a form feed as the end of a line, so no rendered file may carry one."""
    bad = next((c for c in text if not c.isprintable() and c not in "\n\t"), None)
    if bad is not None:
        line = text.count("\n", 0, text.index(bad)) + 1
        raise ValueError(f"{what}: rendered with the control character {bad!r} on line {line}; refused")
    return text


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
    return _checked(environment().get_template("vllm.service.j2").render(
        i=inst, gpu=plan.variant != "cpu", current=CURRENT_LINK, state_dir=STATE_DIR,
        ready_timeout_s=plan.ready_timeout_s,
    ), inst.unit)


# The unit's lines beside sandbox.j2 that confine it: its devices, writable paths and network.
_CONFINING = ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ReadWritePaths", "RestrictAddressFamilies",
              "IPAddressDeny", "IPAddressAllow")


# What a unit file's IPAddressAllow=/IPAddressDeny= words mean (systemd.resource-control(5)); systemd-run's
# property parser takes only the prefixes
_IP_WORDS = {"any": "0.0.0.0/0 ::/0", "localhost": "127.0.0.0/8 ::1/128",
             "link-local": "169.254.0.0/16 fe80::/64", "multicast": "224.0.0.0/4 ff00::/8"}


def sandbox_properties(plan: HostPlan, inst: InstancePlan) -> list[str]:
    """The instance unit's hardening as `Key=value` lines, in its order, for `systemd-run -p`: read off
    the rendered unit itself, so a transient vLLM (a bench trial, the check before a restart) cannot
    drift from the real one."""
    keys = {line.split("=", 1)[0] for line in environment().get_template("sandbox.j2").render().splitlines()
            if "=" in line}
    keys.update(_CONFINING)
    out = []
    for line in unit(plan, inst).splitlines():
        key, eq, value = line.partition("=")
        if line.startswith("#") or not eq or key not in keys:
            continue
        if key in ("IPAddressAllow", "IPAddressDeny"):
            value = " ".join(_IP_WORDS.get(word, word) for word in value.split())
        out.append(f"{key}={value}")
    return out


def validator_properties(plan: HostPlan, inst: InstancePlan) -> list[str]:
    """Where a deploy's validator runs (vllm_fleet/host/validate_in_unit.py): the unit's working directory
    and sandbox, so what the service could not reach fails the check, not the restarted service."""
    return [f"WorkingDirectory={STATE_DIR}", *sandbox_properties(plan, inst)]


def watchdog_units(inst: InstancePlan) -> tuple[str, str]:
    """(service, timer) file contents of the instance's watchdog; the instance must have one."""
    from vllm_fleet.host.watchdog import RESTART, STATE_NAME, UNIT_STATE, holders_command

    env = environment()
    args = {"i": inst, "w": inst.watchdog, "state_name": STATE_NAME.format(inst.name),
            "script": f"{HOST_TOOLS}/watchdog.py", "restart_status": RESTART,
            "lease": f"{HOST_TOOLS}/lease.py",
            "show": f"systemctl show {UNIT_STATE} {inst.unit}",
            "holders": holders_command(inst.port, inst.unit)}
    return (_checked(env.get_template("vllm-watchdog.service.j2").render(**args), inst.watchdog_units[0]),
            _checked(env.get_template("vllm-watchdog.timer.j2").render(**args), inst.watchdog_units[1]))


def serve_config(plan: HostPlan, inst: InstancePlan) -> str:
    return _checked(environment().get_template("vllm-serve.yaml.j2").render(i=inst, host=plan.host),
                    inst.config_path)


def haproxy_config(b: lb.Balancer, socket: str, maps: str) -> str:
    """maps: the door's folder of map and answer files (lb.door_files)."""
    return _checked(environment().get_template("haproxy.cfg.j2").render(
        lb=b, socket=socket, maps=maps, bufsize=lb.buffer_size(b.spec), max_body=b.spec.max_body_kib * 1024,
        tenant_table=lb.TENANT_TABLE, models_route=lb.MODELS_ROUTE, check_body=lb.check_body,
        metrics_path=lb.METRICS_PATH, tenant_metrics_path=lb.TENANT_METRICS_PATH,
        check_timeout=lb.CHECK_TIMEOUT_S, check_fall=lb.CHECK_FALL),
        "haproxy.cfg")


def door_lua(b: lb.Balancer) -> str:
    """haproxy's Lua for the tenants: their counts for Prometheus and their token limits."""
    return _checked(environment().get_template("door.lua.j2").render(
        tenants=b.spec.tenants, path=lb.TENANT_METRICS_PATH, names=lb.TENANT_METRICS), "door.lua")


def router_unit(b: lb.Balancer, m: lb.Model) -> str:
    r = b.spec.router
    assert r is not None
    return _checked(environment().get_template("vllm-fleet-router.service.j2").render(
        m=m, policy=r.policy, argv=shlex.join(lb.router_argv(b, m))), lb.router_unit(m))


def env_file(inst: InstancePlan, environ: Mapping[str, str]) -> str:
    """The one place secret values are read; only ever written to the host's 0600 env file, which is
    never snapshotted (vllm_fleet/host/hoststate.py: a rollback keeps the current keys)."""
    secrets = {host_var: environ[ctl_var] for host_var, ctl_var in inst.secret_env.items()}
    return _checked(environment().get_template("vllm.env.j2").render(i=inst, secrets=secrets), inst.env_path)


def environment_file(inst: InstancePlan) -> str:
    """The instance's non-secret environment. Not in the unit: a 0644 unit and `systemctl show` give
    every Environment= value to every user, and no name filter tells a proxy URL with a password from
    a harmless setting."""
    return _checked(environment().get_template("vllm.environment.j2").render(i=inst), inst.environment_path)
