"""A load balancer in front of the fleet: which vLLM instances sit behind which haproxy, and how it
checks them (pure: specs in, a config model out).

An inventory host with `vllm_lb` data runs haproxy (`deploys/lb.py`) with one server per instance of
the vLLM hosts it fronts. Why a completion as the health check, not `/health`: `/health` answers 200
while the engine is dead or hung (the API server process is a separate loop), and `/v1/models` is
answered by the API server alone; only a completion proves the model answers. One token every
`check_interval_s` per server is noise next to real traffic. The key the check needs stays out of
haproxy.cfg: haproxy reads it from its environment, which systemd fills from a 0600 file.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from vllm_fleet.core.spec import STRICT, HostSpec, Seq, SpecError, hint_unknown, problem_lines

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# haproxy's environment variable holding the instances' key (from its 0600 EnvironmentFile)
KEY_VAR = "VLLM_FLEET_LB_KEY"
BACKEND = "vllm"


class LbSpec(BaseModel):
    """`vllm_lb` host data: this host runs haproxy in front of vLLM instances. Strict types, as `vllm`."""

    model_config = STRICT

    # where clients connect
    bind: str = Field("0.0.0.0", pattern=r"^[0-9a-fA-F.:]+$")
    port: int = Field(8080, ge=1, le=65535)
    # the vLLM hosts behind it (inventory names); None: every vLLM host of the inventory
    hosts: Seq[str] | None = None
    check_interval_s: int = Field(2, ge=1, le=60)
    # a rollout waits this long for a drained server's sessions to reach 0 before restarting it
    drain_timeout_s: int = Field(120, ge=1, le=3600)
    # draining around restarts; off only to measure what clients see without it
    drain: bool = True

    _known = model_validator(mode="before")(hint_unknown)


@dataclass(frozen=True)
class Server:
    """One vLLM instance as haproxy sees it."""

    name: str  # haproxy server name: "<host>-<instance>"
    host: str
    instance: str
    address: str
    port: int


@dataclass(frozen=True)
class Balancer:
    host: str
    spec: LbSpec
    servers: tuple[Server, ...]
    served_name: str
    api_key_env: str | None

    def servers_of(self, host: str) -> list[Server]:
        return list(self._by_host.get(host, ()))

    @functools.cached_property
    def _by_host(self) -> dict[str, tuple[Server, ...]]:
        """host -> its servers in the balancer's order, made once: each host's lookups (the drain, the
        ready step, status) would otherwise scan the whole fleet's servers."""
        by_host: dict[str, list[Server]] = {}
        for s in self.servers:
            by_host.setdefault(s.host, []).append(s)
        return {h: tuple(v) for h, v in by_host.items()}


def parse_lb(host: str, data: Mapping[str, Any]) -> LbSpec:
    try:
        return LbSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(problem_lines(host, "vllm_lb", e)) from None


def balancers(lbs: Mapping[str, Mapping[str, Any]], specs: Mapping[str, HostSpec],
              addresses: Mapping[str, str]) -> dict[str, Balancer]:
    """Every `vllm_lb` host with the servers it fronts; refuses what could not serve through it."""
    out: dict[str, Balancer] = {}
    problems: list[str] = []
    for lb_host, data in lbs.items():
        try:
            lb = parse_lb(lb_host, data)
        except SpecError as e:
            problems += e.problems
            continue
        hosts = lb.hosts if lb.hosts is not None else list(specs)
        unknown = [h for h in hosts if h not in specs]
        if unknown:
            problems.append(f"{lb_host}: vllm_lb.hosts: not vLLM hosts of this inventory: "
                            + ", ".join(unknown))
            continue
        servers, names, keys = [], set(), set()
        for h in hosts:
            for inst in specs[h].instances:
                where = f"{h}: vllm.instances[{inst.name}].flags.host"
                if inst.flags.host in LOOPBACK:
                    problems.append(f"{where}: {inst.flags.host} is not reachable from the load balancer "
                                    f"{lb_host}; bind 0.0.0.0 or the host's address (a key is required)")
                    continue
                address = addresses.get(h, h) if inst.flags.host in ("0.0.0.0", "::") else inst.flags.host
                servers.append(Server(f"{h}-{inst.name}", h, inst.name, address, inst.flags.port))
                names.add(inst.flags.served_model_name or inst.model.name)
                keys.add(inst.api_key_env)
        if len(names) > 1:
            problems.append(f"{lb_host}: vllm_lb: the instances behind it serve different models "
                            f"({', '.join(sorted(names))}); one load balancer serves one model")
        if len(keys) > 1:
            problems.append(f"{lb_host}: vllm_lb: the instances behind it use different key variables "
                            f"({', '.join(sorted(str(k) for k in keys))}); its health check sends one key")
        if not servers and not problems:
            problems.append(f"{lb_host}: vllm_lb: no vLLM instance to balance")
        if servers and len(names) == 1 and len(keys) == 1:
            out[lb_host] = Balancer(lb_host, lb, tuple(servers), names.pop(), keys.pop())
    if problems:
        raise SpecError(problems)
    return out


def check_body(served_name: str) -> str:
    """The health check's completion: one token, so a check costs next to nothing."""
    return json.dumps({"model": served_name, "prompt": "ping", "max_tokens": 1})
