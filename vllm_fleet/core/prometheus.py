"""Prometheus file_sd targets from the hosts' plans (`vllm-fleet targets`). Pure: no I/O.

Built from the plan rather than from a list kept by hand, so a host added to the inventory is scraped
from its first deploy, and the labels (release above all) say what the deploy put there. On an instance
with a key, /metrics is behind the key guard (vllm_fleet/host/keyguard.py) unless its `open_paths` has it:
such an
instance is left out and named in the summary, since a file_sd target cannot carry a bearer token and
the toolkit hands no key to Prometheus.
https://prometheus.io/docs/guides/file-sd/ has the file's format.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vllm_fleet.core import lb
from vllm_fleet.core.environment import is_loopback
from vllm_fleet.core.plan import HostPlan, InstancePlan

# Where roles/targets.py is told to write the file (`vllm-fleet targets --output` sets it).
OUTPUT_ENV = "VLLM_FLEET_TARGETS_OUTPUT"
DEFAULT_OUTPUT = "vllm-targets.json"


@dataclass(frozen=True)
class LeftOut:
    """An instance Prometheus cannot scrape, and why: the summary names it so a missing target is
    explained instead of silently absent."""

    host: str
    instance: str
    why: str


def _wildcard(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_unspecified
    except ValueError:
        return False


def scrape_address(inst: InstancePlan, host_address: str) -> str:
    """`addr:port` to scrape: the bound address when the instance binds one, else the host's address
    as the inventory's SSH connection names it (the one address the controller is known to reach)."""
    addr = host_address if _wildcard(inst.host) else inst.host
    return f"[{addr}]:{inst.port}" if ":" in addr else f"{addr}:{inst.port}"


def metrics_open(inst: InstancePlan) -> list[str]:
    """The instance's paths open without the key (the key guard's environment)."""
    return inst.environment.get("VLLM_FLEET_OPEN_PATHS", "").split(",")


def instance_target(plan: HostPlan, inst: InstancePlan, host_address: str) -> dict[str, Any] | LeftOut:
    """One file_sd group per instance (its labels are its own), or why it is left out."""
    if inst.node is not None and not inst.node.is_head:
        return LeftOut(plan.host, inst.name, f"headless worker of cluster {inst.node.cluster} (no API)")
    if is_loopback(inst.host):
        return LeftOut(plan.host, inst.name, f"binds {inst.host}")
    if inst.flags.get("middleware") and "/metrics" not in metrics_open(inst):
        return LeftOut(plan.host, inst.name, "/metrics needs the API key; add \"/metrics\" to open_paths")
    labels = {"host": plan.host, "instance": inst.name, "model": inst.served_name, "release": plan.release}
    if inst.flags.get("ssl-certfile"):
        labels["__scheme__"] = "https"  # file_sd labels override the scrape config's scheme
    return {"targets": [scrape_address(inst, host_address)], "labels": labels}


def file_sd(plans: Iterable[tuple[HostPlan, str]]) -> tuple[list[dict[str, Any]], list[LeftOut]]:
    """(groups, left out) for (plan, host address) pairs, sorted by host and instance so that a rerun
    on an unchanged fleet writes the same bytes."""
    groups: list[dict[str, Any]] = []
    left_out: list[LeftOut] = []
    for plan, address in sorted(plans, key=lambda p: p[0].host):
        for inst in sorted(plan.instances, key=lambda i: i.name):
            t = instance_target(plan, inst, address)
            if isinstance(t, LeftOut):
                left_out.append(t)
            else:
                groups.append(t)
    return groups, left_out


def door_targets(doors: Iterable[tuple[lb.Balancer, str]]) -> tuple[list[dict[str, Any]], list[LeftOut]]:
    """(groups, left out) for (front door, host address) pairs: haproxy's own exporter (each instance's
    listener, its checks and sessions) and, with tenants, their requests and tokens. The `endpoint`
    label keeps the two apart: they share an address, and Prometheus' `up` would otherwise be one
    series for both."""
    groups: list[dict[str, Any]] = []
    left_out: list[LeftOut] = []
    for b, address in sorted(doors, key=lambda d: d[0].host):
        m = b.spec.metrics
        if m is None:
            left_out.append(LeftOut(b.host, "door", "vllm_lb.metrics is null"))
            continue
        if is_loopback(m.bind):
            left_out.append(LeftOut(b.host, "door", f"its metrics bind {m.bind}"))
            continue
        addr = address if _wildcard(m.bind) else m.bind
        target = f"[{addr}]:{m.port}" if ":" in addr else f"{addr}:{m.port}"
        paths = [("haproxy", lb.METRICS_PATH)]
        if b.spec.tenants:
            paths.append(("tenants", lb.TENANT_METRICS_PATH))
        for endpoint, path in paths:
            groups.append({"targets": [target], "labels": {"host": b.host, "instance": "door",
                                                           "endpoint": endpoint, "__metrics_path__": path}})
    return groups, left_out


def render(groups: list[dict[str, Any]]) -> str:
    return json.dumps(groups, indent=2) + "\n"


def summary(groups: list[dict[str, Any]], left_out: list[LeftOut], path: str) -> str:
    """One line: what was written where, and what is not in it."""
    hosts = len({g["labels"]["host"] for g in groups})
    line = f"targets: {len(groups)} target(s) on {hosts} host(s) written to {path}"
    if left_out:
        line += "; left out: " + ", ".join(f"{x.host}/{x.instance} ({x.why})" for x in left_out)
    return line
