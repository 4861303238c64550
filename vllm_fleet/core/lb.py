"""The front door: one OpenAI-compatible endpoint for every model the inventory serves (pure: specs in,
a config model out).

An inventory host with `vllm_lb` data runs the door (`deploys/lb.py`). Three layers, all on that host:

- the edge, haproxy: TLS, the route allowlist, tenant keys (401 / 403 / 429), body, header and
  slow-client limits; it reads `model` from the request body and picks that model's backend. Tenant
  keys end here: the request goes on without them.
- one router per model, vllm-router from PyPI (the vLLM project's router): cache-aware by default, so a
  conversation's turns go where its prefix is cached. Without `router` data, haproxy balances the
  model's instances itself (least connections).
- one haproxy listener per vLLM instance, on loopback: its health check is a real completion (`/health`
  answers 200 while the engine is dead or hung, and `/v1/models` is answered by the API server
  alone), it is what a rollout drains around a restart, and the other instances of the same model are
  its backups, so a router's pick of a drained or failed instance is served by another one. With
  tenants it sets the instances' own key, which haproxy reads from its environment (a 0600 file); the
  key is in no config file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from vllm_fleet.core.spec import STRICT, HostSpec, Seq, SpecError, hint_unknown, problem_lines

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# haproxy's environment variables holding the instances' keys (from its 0600 EnvironmentFile): the
# prefix, then one per key variable of the instances behind the door
KEY_VAR = "VLLM_FLEET_LB_KEY"
# The routes a client of the served models needs (vLLM's OpenAI-compatible API, its tokenizer and
# pooling routes). Everything else vLLM registers (/metrics, /server_info, /pause, /sleep,
# /collective_rpc, /invocations, /load, the LoRA admin routes, ...) is answered 404 by the door itself.
API_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses",
              "/v1/score", "/v1/rerank", "/v1/audio/transcriptions", "/v1/audio/translations",
              "/tokenize", "/detokenize", "/pooling", "/classify")
MODELS_ROUTE = "/v1/models"
# Ports on the door's loopback, from `router.port_base`: routers, then instance listeners, then the
# routers' Prometheus endpoints, each block this wide.
PORT_BLOCK = 1000
ROUTER_PACKAGE = "vllm-router"
# a listener's completion check: how long one may take, and how many failed in a row take the
# instance out of rotation (failure_bound_s)
CHECK_TIMEOUT_S = 10
CHECK_FALL = 2
TENANT_TABLE = "tenants"
# The door's metrics endpoint: haproxy's own exporter, and the tenants' counts (door.lua)
METRICS_PATH = "/metrics"
TENANT_METRICS_PATH = "/metrics/tenants"
# the tenants' series, as door.lua writes them
TENANT_METRICS = {"requests": "vllm_fleet_door_requests_total", "tokens": "vllm_fleet_door_tokens_total",
                  "window": "vllm_fleet_door_tokens_last_minute",
                  "limit": "vllm_fleet_door_tokens_per_min_limit",
                  "unknown": "vllm_fleet_door_unknown_key_total"}


class RouterSpec(BaseModel):
    """`vllm_lb.router`: the cache-aware router each model gets, installed on the door from a PEP 503
    index into a versioned directory."""

    model_config = STRICT

    version: str = Field("0.1.17", pattern=r"^\d+\.\d+\.\d+$")
    # cache_aware: a prompt goes to the instance holding its longest prefix unless the load is uneven
    policy: Literal["cache_aware", "round_robin", "power_of_two", "consistent_hash", "random"] = "cache_aware"
    index_url: str = Field("https://pypi.org/simple/", pattern=r"^https?://[^@\s]+$")
    port_base: int = Field(30000, ge=1024, le=65535 - 3 * PORT_BLOCK)

    _known = model_validator(mode="before")(hint_unknown)


class TenantSpec(BaseModel):
    """`vllm_lb.tenants[]`: a team with its own keys. The keys are read from the controller's
    environment; the door holds only their SHA-256, and vLLM never sees them."""

    model_config = STRICT

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    # controller environment variables, one key each: several for a rotation, old and new side by side
    key_envs: Seq[str] = Field(min_length=1)
    # served model names it may use; None: every model of the door
    models: Seq[str] | None = None
    # requests over the last 60 s; None: no limit
    requests_per_min: int | None = Field(None, ge=1, le=10_000_000)
    # tokens over the last 60 s (prompt and completion of JSON answers, a stream's max_tokens); once
    # reached, requests are refused until the window has room. None: no limit
    tokens_per_min: int | None = Field(None, ge=1, le=1_000_000_000)

    _known = model_validator(mode="before")(hint_unknown)


class MetricsSpec(BaseModel):
    """`vllm_lb.metrics`: where Prometheus scrapes the door: haproxy's own exporter on /metrics (every
    listener's state and checks), the tenants' requests and tokens on /metrics/tenants."""

    model_config = STRICT

    # loopback by default: tenant names and usage are not for the door's clients
    bind: str = Field("127.0.0.1", pattern=r"^[0-9a-fA-F.:]+$")
    port: int = Field(8405, ge=1, le=65535)

    _known = model_validator(mode="before")(hint_unknown)


class LbSpec(BaseModel):
    """`vllm_lb` host data: this host is the fleet's front door. Strict types, as `vllm`."""

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
    router: RouterSpec | None = Field(default_factory=RouterSpec)
    tenants: Seq[TenantSpec] = Field(default_factory=list)
    # TLS: a PEM file on the door host holding the certificate chain and its key
    tls_certificate: str | None = Field(None, pattern=r"^/[^\s'\"]*$")
    # requests larger than this are refused (413) before any backend sees them
    max_body_kib: int = Field(1024, ge=16, le=65536)
    # a client must send its whole request header within this time
    client_header_timeout_s: int = Field(10, ge=1, le=600)
    # routes beyond API_ROUTES a served model needs (exact paths)
    extra_routes: Seq[str] = Field(default_factory=list)
    # None: no metrics endpoint
    metrics: MetricsSpec | None = Field(default_factory=MetricsSpec)

    _known = model_validator(mode="before")(hint_unknown)


@dataclass(frozen=True)
class Server:
    """One vLLM instance as the door sees it."""

    name: str  # "<host>-<instance>": its listener's backend and server name
    host: str
    instance: str
    address: str
    port: int
    model: str  # the served model name
    key_var: str | None  # haproxy's environment variable with this instance's key

    @property
    def listener(self) -> str:
        """haproxy's backend/server a rollout drains: the instance's own listener."""
        return f"{self.name}/{self.name}"


@dataclass(frozen=True)
class Model:
    name: str
    slug: str  # for unit and backend names: the name's characters haproxy and systemd both take
    index: int
    servers: tuple[Server, ...]


@dataclass(frozen=True)
class Balancer:
    host: str
    spec: LbSpec
    servers: tuple[Server, ...]
    # served model name -> its instances, in the order of `servers`
    models: tuple[Model, ...]
    # controller environment variable -> haproxy's environment variable for the instances' keys
    key_vars: tuple[tuple[str, str], ...]

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

    def listener_port(self, s: Server) -> int:
        return self.port_base + PORT_BLOCK + self._index[s.name]

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        """server name -> its place, made once: the config renders every listener's port, and each
        router lists its model's, so a list search per port grows with the square of the fleet."""
        return {s.name: i for i, s in enumerate(self.servers)}

    def router_port(self, m: Model) -> int:
        return self.port_base + m.index

    def router_metrics_port(self, m: Model) -> int:
        return self.port_base + 2 * PORT_BLOCK + m.index

    @property
    def port_base(self) -> int:
        return port_base(self.spec)

    @property
    def routes(self) -> tuple[str, ...]:
        return (*API_ROUTES, *self.spec.extra_routes)


def port_base(spec: LbSpec) -> int:
    """The first of the door's loopback ports; without a router the listeners still start there."""
    return (spec.router or RouterSpec()).port_base


def model_slug(name: str) -> str:
    """A served model name as a unit and backend name: its safe characters and a short hash, so
    `org/Model-7B` and `org-Model-7B` stay apart."""
    safe = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:40] or "model"
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:6]}"


def router_unit(m: Model) -> str:
    return f"vllm-fleet-router-{m.slug}.service"


def router_dir(version: str) -> str:
    return f"/opt/vllm-fleet/router/{version}"


def router_argv(b: Balancer, m: Model) -> list[str]:
    """vllm-router's command line for one model: its instances are the door's listeners, so the
    router's picks pass the completion checks and the drains. Retries are the router's: a request a
    listener could not place (503) is tried on another instance."""
    r = b.spec.router
    assert r is not None
    return [f"{router_dir(r.version)}/bin/vllm-router", "--host", "127.0.0.1",
            "--port", str(b.router_port(m)), "--policy", r.policy, "--worker-urls",
            *[f"http://127.0.0.1:{b.listener_port(s)}" for s in m.servers],
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(b.router_metrics_port(m)),
            "--health-check-interval-secs", str(b.spec.check_interval_s),
            "--worker-startup-timeout-secs", "30", "--worker-startup-check-interval", "1",
            "--max-payload-size", str(b.spec.max_body_kib * 1024), "--log-level", "warning"]


def parse_lb(host: str, data: Mapping[str, Any]) -> LbSpec:
    try:
        return LbSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(problem_lines(host, "vllm_lb", e)) from None


def balancers(lbs: Mapping[str, Mapping[str, Any]], specs: Mapping[str, HostSpec],
              addresses: Mapping[str, str]) -> dict[str, Balancer]:
    """Every `vllm_lb` host with the instances it fronts; refuses what could not serve through it."""
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
        found: list[tuple[str, str, str, int, str, str | None]] = []
        for h in hosts:
            for inst in specs[h].instances:
                where = f"{h}: vllm.instances[{inst.name}].flags.host"
                if inst.flags.host in LOOPBACK:
                    problems.append(f"{where}: {inst.flags.host} is not reachable from the load balancer "
                                    f"{lb_host}; bind 0.0.0.0 or the host's address (a key is required)")
                    continue
                address = addresses.get(h, h) if inst.flags.host in ("0.0.0.0", "::") else inst.flags.host
                found.append((h, inst.name, address, inst.flags.port,
                              inst.flags.served_model_name or inst.model.name, inst.api_key_env))
        key_envs = sorted({k for *_, k in found if k})
        key_vars = tuple((k, f"{KEY_VAR}_{i}") for i, k in enumerate(key_envs))
        var_of = dict(key_vars)
        servers = tuple(Server(f"{h}-{i}", h, i, a, p, m, var_of.get(k) if k else None)
                        for h, i, a, p, m, k in found)
        names = list(dict.fromkeys(s.model for s in servers))
        models = tuple(Model(n, model_slug(n), i, tuple(s for s in servers if s.model == n))
                       for i, n in enumerate(names))
        problems += _door_problems(lb_host, lb, names, servers)
        if not servers and not problems:
            problems.append(f"{lb_host}: vllm_lb: no vLLM instance to balance")
        if servers:
            out[lb_host] = Balancer(lb_host, lb, servers, models, key_vars)
    if problems:
        raise SpecError(problems)
    return out


def _door_problems(lb_host: str, lb: LbSpec, names: list[str], servers: tuple[Server, ...]) -> list[str]:
    problems = []
    tenants = [t.name for t in lb.tenants]
    for dup in sorted({t for t in tenants if tenants.count(t) > 1}):
        problems.append(f"{lb_host}: vllm_lb.tenants: {dup} is named twice")
    envs = [e for t in lb.tenants for e in t.key_envs]
    for dup in sorted({e for e in envs if envs.count(e) > 1}):
        problems.append(f"{lb_host}: vllm_lb.tenants: the key variable {dup} is given twice; each key "
                        "belongs to one tenant")
    for t in lb.tenants:
        for m in t.models or ():
            if m not in names:
                problems.append(f"{lb_host}: vllm_lb.tenants[{t.name}].models: {m} is served by no "
                                f"instance behind this door (it serves {', '.join(names) or 'nothing'})")
    for r in lb.extra_routes:
        if not re.fullmatch(r"/[A-Za-z0-9/_.-]+", r):
            problems.append(f"{lb_host}: vllm_lb.extra_routes: {r!r} is not a plain path")
        elif r == "/metrics" or r.startswith(("/pause", "/sleep", "/collective_rpc", "/server_info")):
            problems.append(f"{lb_host}: vllm_lb.extra_routes: {r} is an administration route; clients of "
                            "the door never reach it")
    base = port_base(lb)
    top = base + 3 * PORT_BLOCK - 1
    for field, port in (("port", lb.port), ("metrics.port", lb.metrics.port if lb.metrics else None)):
        if port is not None and base <= port <= top:
            problems.append(f"{lb_host}: vllm_lb.{field}: {port} is inside the door's own loopback ports "
                            f"{base}-{top} (router.port_base)")
    if lb.metrics and lb.metrics.port == lb.port:
        problems.append(f"{lb_host}: vllm_lb.metrics.port: {lb.port} is the door's own port")
    if len(servers) >= PORT_BLOCK:
        problems.append(f"{lb_host}: vllm_lb: {len(servers)} instances; one door fronts fewer than "
                        f"{PORT_BLOCK}")
    return problems


def failure_bound_s(spec: LbSpec) -> int:
    """The longest a hung or dead instance stays in rotation: each of CHECK_FALL checks starts at most
    `check_interval_s` after the last one and fails at the latest when it times out."""
    return CHECK_FALL * (spec.check_interval_s + CHECK_TIMEOUT_S)


def check_body(served_name: str) -> str:
    """The health check's completion: one token, so a check costs next to nothing."""
    return json.dumps({"model": served_name, "prompt": "ping", "max_tokens": 1})


def buffer_size(spec: LbSpec) -> int:
    """haproxy's buffer: the largest body read whole, with room for the header and its rewrites."""
    return spec.max_body_kib * 1024 + 65536


def door_files(b: Balancer, environ: Mapping[str, str]) -> dict[str, str]:
    """The files beside haproxy.cfg: model -> backend, the answers haproxy returns itself, and with
    tenants their maps."""
    files = {"backends.map": "".join(f"{m.name} model-{m.slug}\n" for m in b.models),
             "models.json": models_json(b), "unknown-model.json": unknown_model_json(b)}
    if b.spec.tenants:
        files.update(tenant_maps(b, environ))
    return files


def key_hash(key: str) -> str:
    """What the door holds of a tenant's key: haproxy compares the SHA-256 of the bearer token."""
    return hashlib.sha256(key.encode()).hexdigest()


def tenant_maps(b: Balancer, environ: Mapping[str, str]) -> dict[str, str]:
    """haproxy's map files for the tenants: key hash -> tenant, "tenant model" pairs allowed, tenant ->
    requests per minute. A tenant whose variables are all unset is refused by the caller first."""
    keys = [f"{key_hash(environ[e])} {t.name}" for t in b.spec.tenants for e in t.key_envs if environ.get(e)]
    allowed = [f"{t.name}/{m.name} 1" for t in b.spec.tenants for m in b.models
               if t.models is None or m.name in t.models]
    limits = [f"{t.name} {t.requests_per_min}" for t in b.spec.tenants if t.requests_per_min]
    return {"keys.map": "\n".join(keys) + "\n", "allowed.map": "\n".join(allowed) + "\n",
            "limits.map": "\n".join(limits) + "\n"}


def missing_tenant_keys(b: Balancer, environ: Mapping[str, str]) -> list[str]:
    """A tenant with no key set would be locked out without a word; a rotation leaves one set at least."""
    return [f"{b.host}: vllm_lb.tenants[{t.name}].key_envs: none of {', '.join(t.key_envs)} is set (or all "
            "are empty) in the controller's environment" for t in b.spec.tenants
            if not any(environ.get(e) for e in t.key_envs)]


def models_json(b: Balancer) -> str:
    """/v1/models of the door: the union of the served models, as vLLM lists its own."""
    return json.dumps({"object": "list", "data": [{"id": m.name, "object": "model", "owned_by": "vllm-fleet"}
                                                  for m in b.models]})


def unknown_model_json(b: Balancer) -> str:
    return json.dumps({"error": {"type": "NotFoundError", "code": 404,
                                 "message": "model not served by this endpoint; it serves: "
                                            + ", ".join(m.name for m in b.models)}})


def tenant_usage(text: str) -> dict[str, dict[str, int]]:
    """tenant -> {requests, 4xx, tokens, tokens_60s} from the door's /metrics/tenants text (4xx: the
    door's own refusals, 403, 413, 429 and the like, and the instances' 4xx answers)."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r'(\w+)\{tenant="([^"]+)"(?:,(\w+)="([^"]*)")?\} (\d+)', line.strip())
        if not m:
            continue
        name, tenant, label, value, n = m.group(1), m.group(2), m.group(3), m.group(4), int(m.group(5))
        row = out.setdefault(tenant, {"requests": 0, "4xx": 0, "tokens": 0, "tokens_60s": 0})
        if name == TENANT_METRICS["requests"]:
            row["requests"] += n
            if label == "code" and value.startswith("4"):
                row["4xx"] += n
        elif name == TENANT_METRICS["tokens"]:
            row["tokens"] += n
        elif name == TENANT_METRICS["window"]:
            row["tokens_60s"] = n
    return out


def metrics_url(spec: LbSpec, path: str) -> str | None:
    """The metrics endpoint as the door host itself reaches it."""
    if spec.metrics is None:
        return None
    addr = "127.0.0.1" if spec.metrics.bind in ("0.0.0.0", "::") else spec.metrics.bind
    addr = f"[{addr}]" if ":" in addr else addr
    return f"http://{addr}:{spec.metrics.port}{path}"
