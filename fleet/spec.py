"""The inventory schema: what an operator may declare for a host, checked before any host is touched.

A host's `vllm` data (plain dicts from inventory.py / group_data) is deep-merged over `vllm_defaults`
(usually group_data/all.py), then validated here. Every error names the host and the field path, and
says what is allowed, so a typo in a 50-host inventory is found on the controller in milliseconds instead
of as a crash loop on a GPU server minutes later.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleet.flags import ServeFlags

ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
INSTANCE_NAME = r"^[a-z0-9][a-z0-9-]{0,30}$"


# Set by the planner; an inventory that sets them would silently undo a derived value.
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "VLLM_HOST_IP", "HOME", "HF_HOME",
                "VLLM_CPU_KVCACHE_SPACE", "VLLM_API_KEY", "HF_TOKEN"}


def _hint_unknown(cls: type[BaseModel], data: Any) -> Any:
    """Unknown keys get the closest valid names, like ServeFlags does for flags."""
    if isinstance(data, dict):
        for key in data:
            if key not in cls.model_fields:
                close = difflib.get_close_matches(str(key), list(cls.model_fields), n=3, cutoff=0.6)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(f"@{key}: not a known key{hint} (allowed: {', '.join(cls.model_fields)})")
    return data


class SpecError(ValueError):
    """Bad inventory input: every line names host and field."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class ModelSpec(BaseModel):
    """Where the weights come from. Exactly one source.

    path: a directory on the controller, staged to /var/lib/vllm/models/<name> (air-gapped friendly).
    host_path: already on the host. hf_repo: downloaded by vLLM on the host (needs a route to the hub).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    path: str | None = None
    host_path: str | None = None
    hf_repo: str | None = Field(None, pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str | None = None

    _known = model_validator(mode="before")(classmethod(_hint_unknown))

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [k for k in ("path", "host_path", "hf_repo") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, host_path, hf_repo (got {given or 'none'})")
        if self.host_path and not self.host_path.startswith("/"):
            raise ValueError("host_path must be absolute")
        return self


class InstanceSpec(BaseModel):
    """One `vllm serve` process: its own unit, config, env file and GPUs."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("default", pattern=INSTANCE_NAME)
    model: ModelSpec
    # GPUs this instance gets: a count (the first N free ones) or explicit indexes; None = all of them.
    gpus: Annotated[int, Field(ge=1, le=64)] | Annotated[list[Annotated[int, Field(ge=0, le=63)]],
                                                          Field(min_length=1)] | None = None
    flags: ServeFlags = Field(default_factory=ServeFlags)
    # None: no key at all (refused on a non-loopback bind unless port_protected_elsewhere).
    api_key_env: str | None = Field("VLLM_API_KEY", pattern=ENV_NAME)
    hf_token_env: str | None = Field(None, pattern=ENV_NAME)
    # Non-secret environment for the unit (VLLM_* tuning, proxies). Secrets go through *_env names.
    env: dict[str, str] = Field(default_factory=dict)
    # Non-loopback bind without a key is refused unless the operator says the port is guarded elsewhere.
    port_protected_elsewhere: bool = False
    # CPU hosts: GiB of RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE).
    cpu_kvcache_gib: int = Field(1, ge=1, le=4096)

    _known = model_validator(mode="before")(classmethod(_hint_unknown))

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, v: Any) -> Any:
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"GPU indexes repeat in {v}")
        return v

    @field_validator("env")
    @classmethod
    def _env_not_secret(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.fullmatch(ENV_NAME, key):
                raise ValueError(f"@{key}: not an environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"@{key}: set by vllm-fleet itself (from GPUs, model source or secrets); "
                                 "remove it from env")
            if re.search(r'["\\%\n\r]', value):
                raise ValueError(f"@{key}: quotes, backslashes, % and newlines are not allowed in unit "
                                 "environment values")
            if re.search(r"KEY|TOKEN|SECRET|PASSWORD", key):
                raise ValueError(
                    f"@{key}: looks like a secret; secrets come from the controller's environment "
                    "(api_key_env / hf_token_env), never from the inventory"
                )
        return v


class ClusterSpec(BaseModel):
    """A node group serving one model with vLLM's own multi-node mode (mp executor, no Ray).

    Usually set once in group data (name, nodes, split) with `address` per host. `nodes[0]` is the head:
    it runs the API server and rank 0; the others run `--headless` workers.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=INSTANCE_NAME)
    nodes: list[str] = Field(min_length=2, max_length=1024)
    # pipeline: one pipeline stage per node, tensor-parallel over the node's GPUs (vLLM's advice);
    # tensor: one tensor-parallel group over every node's GPUs (needs a fast interconnect).
    split: Literal["pipeline", "tensor"] = "pipeline"
    # This node's address on the cluster network; default: the host's ssh_hostname when it is an IP.
    address: str | None = None
    # torch.distributed's store on the head (no authentication: reachable from cluster addresses only).
    master_port: int = Field(29501, ge=1024, le=65_535)

    _known = model_validator(mode="before")(classmethod(_hint_unknown))

    @field_validator("nodes")
    @classmethod
    def _unique_nodes(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"a node is listed twice in {v}")
        return v

    @field_validator("address")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ipaddress.ip_address(v)
            except ValueError:
                raise ValueError(f"{v!r} is not an IP address (vLLM binds its ports to it)") from None
        return v


class HostSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field("0.32.0", pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$")
    accelerator: Literal["cuda", "cpu"] = "cuda"
    # Force a build variant (cu130, cu129, cpu); still checked against the driver and GPUs.
    variant: str | None = None
    # cache: the controller's wheel cache is copied to the host, installed with --no-index (air-gapped);
    # registry: the host installs from package indexes itself.
    install_source: Literal["cache", "registry"] = "cache"
    keep_releases: int = Field(3, ge=2, le=20)
    ready_timeout_s: int = Field(600, ge=10, le=7200)
    instances: list[InstanceSpec] = Field(min_length=1)
    cluster: ClusterSpec | None = None

    _known = model_validator(mode="before")(classmethod(_hint_unknown))

    @model_validator(mode="after")
    def _instances_disjoint(self) -> HostSpec:
        seen_names: set[str] = set()
        seen_ports: dict[int, str] = {}
        for i, inst in enumerate(self.instances):
            if inst.name in seen_names:
                raise ValueError(f"@instances[{i}].name: '{inst.name}' is used twice on this host")
            seen_names.add(inst.name)
            port = inst.flags.port
            if port in seen_ports:
                raise ValueError(
                    f"@instances[{i}].flags.port: {port} is already used by instance '{seen_ports[port]}'"
                )
            seen_ports[port] = inst.name
        if self.cluster and len(self.instances) > 1:
            raise ValueError("@cluster: a cluster node runs one instance (the model the node group serves); "
                             f"this host lists {len(self.instances)}")
        return self


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


_UNION_TAG = re.compile(r"^(constrained-\w+|list\[.*|dict\[.*|int|str|float|bool|none|function-.*|"
                        r"union\[.*|literal\[.*)$")


def _path(loc: Iterable[Any]) -> str:
    """pydantic's location as a field path; union member tags (gpus.constrained-int) are not fields."""
    s = ""
    for part in loc:
        if isinstance(part, str) and _UNION_TAG.match(part):
            continue
        if isinstance(part, int):
            s += f"[{part}]"
        else:
            s += ("." if s else "") + str(part)
    return s


def _message(err: Mapping[str, Any]) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "literal_error":
        msg = f"{err['input']!r} is not allowed; allowed: {err['ctx']['expected']}"
    return msg


def parse_host(host_name: str, data: Mapping[str, Any] | None,
               defaults: Mapping[str, Any] | None = None) -> HostSpec:
    """Validate one host's data; raise SpecError with 'host: vllm.field.path: what is wrong' lines."""
    if data is None:
        raise SpecError([f"{host_name}: vllm: missing (not a vLLM host: parse_inventory leaves it out)"])
    if not data:
        raise SpecError([f"{host_name}: vllm: empty (a vLLM host needs at least a model; a host that is not "
                         "a vLLM host has no vllm key at all)"])
    merged = deep_merge(defaults or {}, data)
    allowed = list(HostSpec.model_fields) + list(InstanceSpec.model_fields)
    for key in merged:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SpecError([f"{host_name}: vllm.{key}: not a known key{hint}"])
    # Instance-level keys at the top (model, flags, env, ...) are the one-instance shorthand, or, next to
    # `instances`, defaults that every instance inherits (group-wide flags in vllm_defaults).
    shared = {k: merged.pop(k) for k in list(merged) if k in InstanceSpec.model_fields}
    if "instances" not in merged:
        merged["instances"] = [shared] if shared else []
    elif isinstance(merged["instances"], list):
        merged["instances"] = [deep_merge(shared, i) if isinstance(i, Mapping) else i
                               for i in merged["instances"]]
    try:
        return HostSpec.model_validate(merged)
    except ValidationError as e:
        by_path: dict[str, list[str]] = {}
        for err in e.errors():
            loc = list(err["loc"])
            # pydantic puts a before-validator's error at the model, not the key: name the key ourselves.
            msg = _message(err)
            m = re.match(r"^@([^:]+): (.*)$", msg)
            if m:
                loc.append(m.group(1))
                msg = m.group(2)
            msgs = by_path.setdefault(_path(loc), [])
            if msg not in msgs:
                msgs.append(msg)
        # a union field fails once per member: one line, alternatives joined
        problems = [f"{host_name}: vllm.{path}: {' or '.join(msgs)}" for path, msgs in by_path.items()]
        raise SpecError(problems) from None


def is_vllm_host(data: Mapping[str, Any] | None) -> bool:
    """The rule for mixed inventories: a host is a vLLM host when it has `vllm` data of its own or from
    a group; fleet-wide `vllm_defaults` alone do not make one. Every other host (a database, a load
    balancer) is left alone by the vLLM deploys, which say how many they skipped."""
    return data is not None


def skipped_note(names: list[str]) -> str:
    """What every vLLM deploy and command says about the hosts it left alone."""
    return f"skipped {len(names)} host(s) without vllm data, left untouched: {', '.join(names)}"


def parse_inventory(hosts: Iterable[tuple[str, Mapping[str, Any] | None, Mapping[str, Any] | None]]
                    ) -> dict[str, HostSpec]:
    """Validate every vLLM host before any is touched; report all problems at once. Hosts that are not
    vLLM hosts (is_vllm_host) are not in the result."""
    specs: dict[str, HostSpec] = {}
    problems: list[str] = []
    for name, data, defaults in hosts:
        if not is_vllm_host(data):
            continue
        try:
            specs[name] = parse_host(name, data, defaults)
        except SpecError as e:
            problems.extend(e.problems)
    if problems:
        raise SpecError(problems)
    return specs
