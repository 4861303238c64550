"""The inventory schema: what an operator may declare for a host, checked before any host is touched.

A host's `vllm` data (plain dicts from inventory.py / group_data) is deep-merged over `vllm_defaults`
(usually group_data/all.py), then validated here. Every error names the host and the field path, and
says what is allowed, so a typo in a 50-host inventory is found on the controller in milliseconds instead
of as a crash loop on a GPU server minutes later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleet.flags import ServeFlags

ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
INSTANCE_NAME = r"^[a-z0-9][a-z0-9-]{0,30}$"


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
    gpus: int | list[int] | None = None
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

    @field_validator("env")
    @classmethod
    def _env_not_secret(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.fullmatch(ENV_NAME, key):
                raise ValueError(f"{key}: not an environment variable name")
            if re.search(r"KEY|TOKEN|SECRET|PASSWORD", key):
                raise ValueError(
                    f"{key}: looks like a secret; secrets come from the controller's environment "
                    "(api_key_env / hf_token_env), never from the inventory"
                )
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

    @model_validator(mode="after")
    def _instances_disjoint(self) -> HostSpec:
        seen_names: set[str] = set()
        seen_ports: dict[int, str] = {}
        for i, inst in enumerate(self.instances):
            if inst.name in seen_names:
                raise ValueError(f"instances[{i}].name: '{inst.name}' is used twice on this host")
            seen_names.add(inst.name)
            port = inst.flags.port
            if port in seen_ports:
                raise ValueError(
                    f"instances[{i}].flags.port: {port} is already used by instance '{seen_ports[port]}'"
                )
            seen_ports[port] = inst.name
        return self


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _path(loc: Iterable[Any]) -> str:
    s = ""
    for part in loc:
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
    if not data:
        raise SpecError([f"{host_name}: vllm: missing (every host in a vLLM inventory needs a vllm dict)"])
    merged = deep_merge(defaults or {}, data)
    # `model`/`flags` at top level are the one-instance shorthand.
    if "instances" not in merged:
        inst = {k: merged.pop(k) for k in list(merged) if k in InstanceSpec.model_fields}
        merged["instances"] = [inst] if inst else []
    try:
        return HostSpec.model_validate(merged)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = list(err["loc"])
            # pydantic puts a before-validator's error at the model, not the key: name the key ourselves.
            msg = _message(err)
            m = re.match(r"^@([^:]+): (.*)$", msg)
            if m:
                loc.append(m.group(1))
                msg = m.group(2)
            problems.append(f"{host_name}: vllm.{_path(loc)}: {msg}")
        raise SpecError(problems) from None


def parse_inventory(hosts: Iterable[tuple[str, Mapping[str, Any] | None, Mapping[str, Any] | None]]
                    ) -> dict[str, HostSpec]:
    """Validate every host before any is touched; report all problems at once."""
    specs: dict[str, HostSpec] = {}
    problems: list[str] = []
    for name, data, defaults in hosts:
        try:
            specs[name] = parse_host(name, data, defaults)
        except SpecError as e:
            problems.extend(e.problems)
    if problems:
        raise SpecError(problems)
    return specs
