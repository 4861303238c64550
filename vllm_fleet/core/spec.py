"""The inventory schema: what an operator may declare for a host, checked before any host is touched.

A host's `vllm` data (plain dicts from inventory.py / group_data) is deep-merged over `vllm_defaults`
(usually group_data/all.py), then validated here. Every error names the host and the field path, and
says what is allowed, so a typo in a 50-host inventory is found on the controller in milliseconds instead
of as a crash loop on a GPU server minutes later.

The inventory is Python, so values are taken at their Python type (strict mode): `"8000"` is not a port
and `1` is not `True`. The one widening is that a tuple is accepted wherever a list is (`Seq`), because
Python inventories write both. docs/inventory.md#types has the rule and an example message.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from vllm_fleet.core.flags import WIDENING_FLAGS, Seq, ServeFlags, did_you_mean
from vllm_fleet.host import effective

ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
INSTANCE_NAME = r"^[a-z0-9][a-z0-9-]{0,30}$"


# Set by the planner; an inventory that sets them would silently undo a derived value.
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "VLLM_HOST_IP", "HOME", "HF_HOME",
                "VLLM_CPU_KVCACHE_SPACE", "VLLM_API_KEY", "HF_TOKEN",
                # the key guard's module path and open paths (vllm_fleet/host/keyguard.py; `open_paths`)
                "PYTHONPATH", "VLLM_FLEET_OPEN_PATHS"}
# Paths `open_paths` may answer without the key: none runs the model or changes the server.
OPENABLE_PATHS = ("/health", "/metrics", "/ping", "/version")

# Switches that open vLLM's admin/dev routes, runtime updates or logging of what clients receive
# (read in vLLM 0.32's envs.py and entrypoints/): no inventory may turn them on for a served instance.
UNSAFE_ENV = {
    "VLLM_SERVER_DEV_MODE": "opens vLLM's development routes (sleep/wake, cache resets, collective_rpc "
                            "into the workers) to every client of the API",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "lets any client of the API load and unload LoRA adapters from "
                                        "paths or the hub at runtime",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "writes every response the API sends into the journal, which "
                                          "more people read than the API's clients",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "lets vLLM's internal messages carry pickles, so whoever reaches "
                                         "its internal sockets can run code as the vllm user",
    "VLLM_ENABLE_RESPONSES_API_STORE": "keeps every client's Responses API conversation in memory, "
                                       "readable by response id and never freed",
    # a frontend outside vLLM's Python app never loads the key guard (vllm_fleet/host/keyguard.py)
    "VLLM_USE_RUST_FRONTEND": "serves the API through vLLM's Rust frontend, which never loads the key "
                              "guard, so routes outside vLLM's own key prefixes answer without the key",
    "VLLM_RUST_FRONTEND_PATH": "runs another binary as vLLM's API frontend, outside the key guard",
}
# Variables that change which code or libraries the service loads: the dynamic loader's and Python's.
# A value in the inventory would run whatever it names inside the service, beside the model and keys.
LOADER_ENV = {
    "LD_PRELOAD": "loads a library into every process of the service before its own",
    "LD_LIBRARY_PATH": "makes the loader look for the service's libraries (CUDA, NCCL, torch) elsewhere",
    "LD_AUDIT": "loads an audit library into every process of the service",
    "PYTHONHOME": "runs the service on another Python installation",
    "PYTHONSTARTUP": "runs a file at interpreter start (interactive only, but never wanted)",
    "PYTHONUSERBASE": "adds a user site directory in front of the release's own packages",
    "PYTHONBREAKPOINT": "imports and calls the named function at every breakpoint()",
    "PYTHONINSPECT": "drops a crashed service into an interactive prompt",
    "PYTHONEXECUTABLE": "changes which interpreter child processes start",
}
UNSAFE_ENV.update({k: f"{why}; the service loads only its release's code"
                   for k, why in LOADER_ENV.items()})
# The vllm user's home (HF cache, compile caches): the one directory it can write
# (vllm_fleet.core.plan.STATE_DIR).
VLLM_WRITABLE = "/var/lib/vllm"
# Environment names that look like credentials (a value in the inventory is in version control).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)
# An inventory host name: it is printed in rendered files (the serve config's comment, a cluster's unit).
HOST_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.@:+-]{0,252}$"

# Every inventory model: unknown keys refused, values at their own Python type (an int for a float is
# the one conversion strict mode makes, and it loses nothing).
# a field's docstring is its documentation: docs/inventory.md's tables are generated from it (keydoc.py)
STRICT = ConfigDict(extra="forbid", strict=True)



def _quiet_logging(value: str) -> set[str]:
    """Environment settings that keep vLLM's start-up log from the journal, given a value."""
    quiet = set()
    if value.strip().upper() in ("WARNING", "WARN", "ERROR", "CRITICAL"):
        quiet.add("VLLM_LOGGING_LEVEL")
    if value.strip() == "0":
        quiet.add("VLLM_CONFIGURE_LOGGING")
    return quiet


def hint_unknown(cls: type[BaseModel], data: Any) -> Any:
    """Unknown keys get the closest valid names, like ServeFlags does for flags."""
    if isinstance(data, dict):
        for key in data:
            if key not in cls.model_fields:
                raise ValueError(f"@{key}: not a known key{did_you_mean(key, cls.model_fields)} "
                                 f"(allowed: {', '.join(cls.model_fields)})")
    return data


def instance_labels(names: Sequence[object]) -> list[str]:
    """How field paths name instance i: by its name, as the planner and the operator do, unless the name
    is not a valid one or is used twice (then only the index says which instance is meant)."""
    counts = Counter(n for n in names if isinstance(n, str))
    return [n if isinstance(n, str) and re.fullmatch(INSTANCE_NAME, n) and counts[n] == 1 else str(i)
            for i, n in enumerate(names)]


class SpecError(ValueError):
    """Bad inventory input: every line names host and field."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class ModelSpec(BaseModel):
    """Where the weights come from. Exactly one source.

    path: a directory on the controller, staged to /opt/vllm/models/<name>/<content digest>, root-owned
        and read-only to vllm (air-gapped friendly).
    host_path: already on the host. hf_repo: a hub repository (`hf_endpoint`), `revision` a branch, tag or
        commit (default `main`), resolved to its commit at plan time and fetched by the deploy before any
        restart.
    """

    model_config = STRICT

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    path: str | None = None
    host_path: str | None = None
    hf_repo: str | None = Field(None, pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str | None = Field(None, pattern=r"^[A-Za-z0-9_./-]+$", max_length=255)

    _known = model_validator(mode="before")(hint_unknown)

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [k for k in ("path", "host_path", "hf_repo") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, host_path, hf_repo (got {given or 'none'})")
        if self.host_path and not self.host_path.startswith("/"):
            raise ValueError("host_path must be absolute")
        if self.host_path and (os.path.normpath(self.host_path) + "/").startswith(VLLM_WRITABLE + "/"):
            # root reads it (the host fact, the validator): the vllm user could plant links or code there
            raise ValueError(f"host_path {self.host_path} is inside {VLLM_WRITABLE}, which the vllm user "
                             "can write: put the model where only root writes (e.g. /opt/vllm/models/...)")
        if self.host_path and effective.hidden_by_sandbox(self.host_path):
            raise ValueError(f"host_path {self.host_path}: the service would not find it: "
                             f"{effective.SANDBOX_HIDES}; put the model where only root writes "
                             "(e.g. /opt/vllm/models/...)")
        return self


class WatchdogSpec(BaseModel):
    """A probe of the instance with a real tiny completion, restarting it when the engine hangs.

    Why: vLLM's /health only says whether the API server has noticed the engine die; an engine that is
    alive but stuck keeps /health at 200 while every request waits. A hung instance is restarted within
    about `failures` x (`interval_s` + `timeout_s`) of the first failed probe; one that has not served
    since it started is left alone until the host's `ready_timeout_s` has passed (a model still loading).
    """

    model_config = STRICT

    enabled: bool = True
    """`False` removes the timer and its probe unit"""
    interval_s: int = Field(30, ge=2, le=3600)
    """seconds from the end of one probe to the start of the next"""
    timeout_s: int = Field(30, ge=1, le=600)
    """a completion slower than this is a failure"""
    failures: int = Field(3, ge=1, le=20)
    """failed probes in a row before the restart (with the defaults: within 180 s)"""

    _known = model_validator(mode="before")(hint_unknown)


class InstanceSpec(BaseModel):
    """One `vllm serve` process: its own unit, config, env file and GPUs."""

    model_config = STRICT

    name: str = Field("default", pattern=INSTANCE_NAME)
    """unit `vllm-<name>.service`, `/etc/vllm/<name>.yaml`, `.environment` and `.env`"""
    model: ModelSpec
    """`name` and one source: `path` staged from the controller, `host_path` already on the host, or
    `hf_repo` (with an optional `revision`) fetched from `hf_endpoint` by the deploy; `name` is the
    served model name
    """
    gpus: Annotated[int, Field(ge=1, le=64)] | Annotated[Seq[Annotated[int, Field(ge=0, le=63)]],
                                                          Field(min_length=1)] | None = None
    """a count (first N free) or a list of indexes; a GPU no build of the release supports is left out with
    a warning, and only an instance pinned to it is refused; sets `CUDA_VISIBLE_DEVICES` and the TP size

    default: all free GPUs vLLM can use
    """
    flags: ServeFlags = Field(default_factory=ServeFlags)
    """`vllm serve` flags

    default: see below
    from: see each flag
    """
    api_key_env: str | None = Field("VLLM_API_KEY", pattern=ENV_NAME)
    """controller variable holding the key; `None`: no key (refused on a non-loopback bind unless
    `port_protected_elsewhere`)
    """
    hf_token_env: str | None = Field(None, pattern=ENV_NAME)
    """controller variable holding an HF token: used by the fetch of an `hf_repo` model only (a 0600 root
    file on the host), never given to vLLM, which serves the fetched snapshot offline
    """
    env: dict[str, str] = Field(default_factory=dict)
    """extra non-secret environment for the unit; secret-looking and planner-owned names are refused"""
    port_protected_elsewhere: bool = False
    """allow a network bind without a key (a firewall or proxy guards the port)"""
    cpu_kvcache_gib: int = Field(1, ge=1, le=4096)
    """CPU hosts: `VLLM_CPU_KVCACHE_SPACE`"""
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    """a probe with a real completion that restarts a hung engine (`enabled`, `interval_s`, `timeout_s`,
    `failures`)

    default: on
    """
    open_paths: Seq[str] = Field(default_factory=lambda: ["/health"])
    """exact paths answered without the key on an instance with one; every other route (POST
    `/invocations`, `/scale_elastic_ep`, websockets, `/metrics`, the docs) needs `Authorization: Bearer
    <key>`, checked by vllm-fleet's key guard loaded through vLLM's `--middleware` (vLLM's own check
    covers `/v1`, `/v2`, `/inference`, `/cohere` only). May hold `/health` (required), `/metrics`,
    `/ping`, `/version`; add `/metrics` for Prometheus (`vllm-fleet targets` leaves an instance out
    otherwise)
    """

    widen: Seq[str] = Field(default_factory=list)
    """the `extra_args` that widen what a key holder can read or make the server do (serving files under
    `allowed-local-media-path`, CORS, prompts in the journal, tool servers), acknowledged by name: each
    is refused until it is listed here
    """

    _known = model_validator(mode="before")(hint_unknown)

    @model_validator(mode="after")
    def _widening_acknowledged(self) -> InstanceSpec:
        for name in self.widen:
            if name not in WIDENING_FLAGS:
                raise ValueError(f"@widen: {name!r} is not an option that needs acknowledging; known: "
                                 f"{', '.join(sorted(WIDENING_FLAGS))}")
        for name, value in self.flags.extra_args.items():
            if value in (False, None, "", 0, []):  # off, as its default: nothing is widened
                continue
            if name in WIDENING_FLAGS and name not in self.widen:
                raise ValueError(f"@flags.extra_args.{name}: {WIDENING_FLAGS[name]}; to serve with it, "
                                 f"acknowledge it in this instance's widen: [{name}]")
            if name == "allowed-local-media-path" and str(self.flags.extra_args[name]).rstrip("/") in (
                    "", "/etc", "/var", "/var/lib", "/root", "/home", "/opt", "/usr", "/proc", "/sys"):
                raise ValueError(f"@flags.extra_args.{name}: {self.flags.extra_args[name]!r} would serve a "
                                 "whole system directory to every key holder; name the media directory "
                                 "itself")
        return self

    @model_validator(mode="after")
    def _paths_the_service_can_see(self) -> InstanceSpec:
        """A path the unit's sandbox hides would pass nowhere but in a root shell: the host check, run as
        the service, finds it missing; said here, before any host is touched."""
        for name, value in self.flags.extra_args.items():
            hidden = [p for p in effective.config_paths(name, value) if effective.hidden_by_sandbox(p)]
            if hidden:
                raise ValueError(f"@flags.extra_args.{name}: the service would not find {hidden[0]}: "
                                 f"{effective.SANDBOX_HIDES}; put it where the vllm user reads it "
                                 "(/etc/vllm, or beside the model)")
        return self

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, v: Any) -> Any:
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"GPU indexes repeat in {v}")
        return v

    @field_validator("open_paths")
    @classmethod
    def _openable(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if p not in OPENABLE_PATHS]
        if bad:
            raise ValueError(f"{bad[0]!r} cannot be opened: only {', '.join(OPENABLE_PATHS)} may answer "
                             "without the key (every other route runs the model or changes the server)")
        if "/health" not in v:
            raise ValueError("'/health' must stay open: readiness waits and probes read it without the key")
        return list(dict.fromkeys(v))

    @field_validator("env")
    @classmethod
    def _env_not_secret(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.fullmatch(ENV_NAME, key):
                raise ValueError(f"@{key}: not an environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"@{key}: set by vllm-fleet itself (from GPUs, model source or secrets); "
                                 "remove it from env")
            if key in UNSAFE_ENV:
                raise ValueError(f"@{key}: {UNSAFE_ENV[key]}; remove it from env")
            if key.startswith("LD_"):
                raise ValueError(f"@{key}: a dynamic loader variable changes which libraries the service "
                                 "loads; the service loads only its release's code; remove it from env")
            if re.search(r'["\\%\n\r]', value):
                raise ValueError(f"@{key}: quotes, backslashes, % and newlines are not allowed in unit "
                                 "environment values")
            if key in _quiet_logging(value):
                raise ValueError(f"@{key}: {value!r} hides vLLM's INFO start-up lines, which the deploy "
                                 "reads after every restart to prove the settings are in effect; remove it")
            if SECRET_NAME.search(key):
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

    model_config = STRICT

    name: str = Field(pattern=INSTANCE_NAME)
    nodes: Seq[str] = Field(min_length=2, max_length=1024)
    # pipeline: one pipeline stage per node, tensor-parallel over the node's GPUs (vLLM's advice);
    # tensor: one tensor-parallel group over every node's GPUs (needs a fast interconnect).
    split: Literal["pipeline", "tensor"] = "pipeline"
    # This node's address on the cluster network; default: the host's ssh_hostname when it is an IP.
    address: str | None = None
    # torch.distributed's store on the head (no authentication: reachable from cluster addresses only).
    master_port: int = Field(29501, ge=1024, le=65_535)

    _known = model_validator(mode="before")(hint_unknown)

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


# no user:password@: the URL is printed in plans and logs and is in the host's uv command line; an index
# that needs credentials gets them from netrc on the controller and the hosts (uv and pip read it)
_INDEX_URL = r"^https?://[A-Za-z0-9.:\[\]-]+(/[^\s@]*)?$"


class PackageIndexSpec(BaseModel):
    """Where a fleet's Python packages come from: a site's PEP 503 index (a PyPI mirror, devpi, proxpi,
    Artifactory), replacing PyPI and the variant table's public indexes. The controller resolves each
    lock there; hosts with `install_source: registry` install the lock from it."""

    model_config = STRICT

    index_url: str = Field(pattern=_INDEX_URL)
    extra_index_urls: Seq[str] = Field(default_factory=list)
    index_strategy: Literal["first-index", "unsafe-first-match", "unsafe-best-match"] | None = None

    _known = model_validator(mode="before")(hint_unknown)

    @field_validator("extra_index_urls")
    @classmethod
    def _urls(cls, v: Sequence[str]) -> Sequence[str]:
        for url in v:
            if not re.match(_INDEX_URL, url):
                raise ValueError(f"{url!r} is not an http(s) index URL without credentials (use netrc)")
        return v


class HostSpec(BaseModel):
    model_config = STRICT

    version: str = Field("0.32.0", pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$")
    """vLLM release; must be in the release table (`vllm-fleet explain version` lists it)

    from: this toolkit's tested release
    """
    accelerator: Literal["cuda", "cpu"] = "cuda"
    """`cuda` (variant chosen from nvidia-smi) or `cpu` (vLLM's CPU build)"""
    variant: str | None = None
    """force `cu130`, `cu129`, `cpu`; still checked against driver and GPUs

    from: chosen from facts
    """
    install_source: Literal["cache", "registry"] = "cache"
    """`cache`: controller wheel cache → host, `--no-index`; `registry`: the host installs from indexes

    from: air-gapped default
    """
    keep_releases: int = Field(3, ge=2, le=20)
    """releases kept under `/opt/vllm/releases` (current and previous are never pruned)"""
    ready_timeout_s: int = Field(600, ge=10, le=7200)
    """bound on the wait for `/health` after a restart; also the unit's `TimeoutStartSec`"""
    hf_endpoint: str | None = Field(None, pattern=r"^https?://[A-Za-z0-9.:\[\]-]+(/[^\s]*)?$")
    """the hub `hf_repo` models come from: a site mirror's URL (the controller resolves revisions there at
    plan time, the hosts fetch from it)

    default: `https://huggingface.co`
    """
    package_index: PackageIndexSpec | None = None
    """the fleet's own index (`index_url`, `extra_index_urls`, `index_strategy`), replacing PyPI and the
    variant table's public indexes, for the controller's lock and store and for registry installs

    default: PyPI and the variant's indexes
    """
    instances: Seq[InstanceSpec] = Field(min_length=1)
    """list of instances; instance keys at host level are the one-instance shorthand, or, next to
    `instances`, defaults every instance inherits

    default: one `default`
    """
    cluster: ClusterSpec | None = None
    """this host is a node of a group serving one model (vLLM's multi-node mode): `name`, `nodes`
    (inventory names, head first), `split` (`pipeline`: a stage per node, TP over its GPUs; `tensor`: one
    TP group over all nodes),
    `address` (the node's IP on the cluster network; default its `ssh_hostname`), `master_port`
    (`29501`)
    """

    _known = model_validator(mode="before")(hint_unknown)

    @model_validator(mode="after")
    def _instances_disjoint(self) -> HostSpec:
        seen_names: set[str] = set()
        seen_ports: dict[int, str] = {}
        labels = instance_labels([inst.name for inst in self.instances])
        for inst, label in zip(self.instances, labels, strict=True):
            if inst.name in seen_names:
                raise ValueError(f"@instances[{label}].name: '{inst.name}' is used twice on this host")
            seen_names.add(inst.name)
            port = inst.flags.port
            if port in seen_ports:
                raise ValueError(
                    f"@instances[{label}].flags.port: {port} is already used by instance '{seen_ports[port]}'"
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


def _path(loc: Iterable[Any], labels: Sequence[str] = ()) -> tuple[str, str | None]:
    """pydantic's location as a field path, and the path of the union it went through, if any.

    Union member tags (gpus.constrained-int) are not fields; instance i is named by labels[i].
    """
    parts = list(loc)
    s, union_at = "", None
    for i, part in enumerate(parts):
        if isinstance(part, str) and _UNION_TAG.match(part):
            union_at = s if union_at is None else union_at
            continue
        if isinstance(part, int):
            top_instance = i == 1 and parts[0] == "instances" and part < len(labels)
            s += f"[{labels[part] if top_instance else part}]"
        else:
            s += ("." if s else "") + str(part)
    return s, union_at


# pydantic's type errors as the type the field wanted; the lax ones (int_parsing) too, so that a model
# without strict mode still reads the same.
_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "a boolean", "bool_parsing": "a boolean",
    "string_type": "a string", "list_type": "a list",
    "dict_type": "a dict", "model_type": "a dict", "model_attributes_type": "a dict",
}
# A value under such a key may be a secret: its type is named, never the value.
_SECRET_KEY = SECRET_NAME


def _given(value: Any, secret: bool = False) -> str:
    """The value as the operator wrote it, with its Python type: '8000' (str)."""
    kind = type(value).__name__
    if secret:
        return f"the value ({kind})"
    if value is None:
        return "None"
    text = repr(value)
    return f"{text if len(text) <= 40 else text[:36] + ' ...'} ({kind})"


def _meant(value: Any, expected: str) -> str | None:
    """What the operator most likely meant, only where that is unambiguous."""
    if expected == "an integer":
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return str(int(value))
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
    elif expected == "a number":
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", value):
            return value.strip()
    elif expected == "a boolean":
        word = str(value).strip().lower() if isinstance(value, str | int) else None
        if word in ("true", "yes", "on", "1"):
            return "True"
        if word in ("false", "no", "off", "0"):
            return "False"
    elif expected == "a string" and isinstance(value, int | float) and not isinstance(value, bool):
        return repr(str(value))
    elif expected == "a string" and isinstance(value, os.PathLike):
        return repr(os.fspath(value))
    return None


def _english_or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@dataclass(frozen=True)
class _WrongType:
    """A type refusal; the members of a union field (gpus: an int or a list) join into one sentence."""

    given: str
    expected: str
    meant: str | None


def _literal(value: Any, expected: str) -> str:
    """A choice refused: the allowed values, and the one probably meant (16 for '16', a near spelling)."""
    options = re.split(r", | or ", expected)
    quoted = all(o.startswith("'") for o in options)
    given = repr(value) if isinstance(value, str) == quoted else _given(value)
    msg = f"{given} is not allowed; allowed: {expected}"
    text = value.strip() if isinstance(value, str) else repr(str(value))
    if text in options:
        return f"{msg}; write {text}"
    return msg + (did_you_mean(repr(value), options, n=1) if isinstance(value, str) else "")


def _message(err: Mapping[str, Any]) -> str | _WrongType:
    kind = err["type"]
    if kind in _EXPECTED:
        value = err["input"]
        last = next((p for p in reversed(err["loc"]) if isinstance(p, str) and not _UNION_TAG.match(p)), "")
        secret = bool(_SECRET_KEY.search(last)) and not last.endswith("_env")
        expected = _EXPECTED[kind]
        return _WrongType(_given(value, secret), expected, None if secret else _meant(value, expected))
    if kind == "literal_error":
        return _literal(err["input"], err["ctx"]["expected"])
    return str(err["msg"]).removeprefix("Value error, ")


def _joined(msgs: list[str | _WrongType]) -> str:
    """One line per field: a union's type refusals as one sentence, other alternatives joined by 'or'."""
    wrong = [m for m in msgs if isinstance(m, _WrongType)]
    out = [m for m in msgs if isinstance(m, str)]
    if wrong:
        expected = list(dict.fromkeys(m.expected for m in wrong))
        meant = next((m.meant for m in wrong if m.meant), None)
        if meant is None and expected == ["a boolean"]:
            meant = "True or False"
        line = f"{wrong[0].given} is not {_english_or(expected)}"
        out.insert(0, f"{line}; write {meant}" if meant else line)
    return " or ".join(out)


def problem_lines(host: str, root: str, error: ValidationError, labels: Sequence[str] = ()) -> list[str]:
    """pydantic's errors as '<host>: <root>.<field path>: <what is wrong and what is allowed>' lines."""
    found: list[tuple[str, str | None, str | _WrongType]] = []
    for err in error.errors():
        path, union_at = _path(err["loc"], labels)
        msg = _message(err)
        # a before-validator's error is placed at the model, not the key: the message names the key
        m = re.match(r"^@([^:]+): (.*)$", msg, re.DOTALL) if isinstance(msg, str) else None
        if m:
            path = f"{path}.{m.group(1)}" if path else m.group(1)
            msg = m.group(2)
        found.append((path, union_at, msg))
    # A union member that took the value's type (its error is deeper or not about the type) says what is
    # wrong; the members that refused the type only add noise (gpus=[0, 99]: not "is not an integer").
    typed = {u for p, u, msg in found if u is not None and (p != u or not isinstance(msg, _WrongType))}
    by_path: dict[str, list[str | _WrongType]] = {}
    for path, union_at, msg in found:
        if union_at in typed and path == union_at and isinstance(msg, _WrongType):
            continue
        msgs = by_path.setdefault(path, [])
        if msg not in msgs:
            msgs.append(msg)
    return [f"{host}: {root}{'.' + path if path else ''}: {_joined(msgs)}" for path, msgs in by_path.items()]


def _unprintable(value: Any, path: str) -> Iterable[tuple[str, str]]:
    """(field path, the first character) for every string in the data holding a non-printable one.

    Why every string, keys too: each may reach a rendered file, and systemd reads a NUL or a line break in
    a unit or env file as the end of a line (`x\\0User=root` ran the unit as root); YAML and comments
    break the same way. One walk over the raw data covers fields added later, too.
    """
    if isinstance(value, str):
        bad = next((c for c in value if not c.isprintable()), None)
        if bad is not None:
            yield path, bad
    elif isinstance(value, Mapping):
        for k, v in value.items():
            name = k if isinstance(k, str) and k.isprintable() else repr(k)
            child = f"{path}.{name}" if path else name
            yield from _unprintable(k, child)  # the key itself: env names are printed too
            yield from _unprintable(v, child)
    elif isinstance(value, list | tuple):
        names = [i.get("name", "default") if isinstance(i, Mapping) else None for i in value]
        labels = instance_labels(names) if path == "instances" else [str(i) for i in range(len(value))]
        for label, item in zip(labels, value, strict=True):
            yield from _unprintable(item, f"{path}[{label}]")


def control_problems(host_name: str, root: str, data: Any) -> list[str]:
    """'host: root.path: ...' for each string with a control character; the value is never echoed."""
    return [f"{host_name}: {root}{'.' + path if path else ''}: contains the non-printable character "
            f"{bad!r}: systemd and YAML read such characters as line breaks or ends of values; only "
            "printable characters are allowed"
            for path, bad in _unprintable(data, "")]


def host_name_problem(host_name: object) -> str | None:
    """An inventory name is printed into rendered files: only host-name-like ones are allowed."""
    if isinstance(host_name, str) and re.fullmatch(HOST_NAME, host_name):
        return None
    return (f"{host_name!r}: inventory host name: only letters, digits and . _ - @ : + are allowed (at most "
            "253): the name is written into rendered files, where other characters could start a new line")


def parse_host(host_name: str, data: Mapping[str, Any] | None,
               defaults: Mapping[str, Any] | None = None) -> HostSpec:
    """Validate one host's data; raise SpecError with 'host: vllm.field.path: what is wrong' lines."""
    if (bad_name := host_name_problem(host_name)) is not None:
        raise SpecError([bad_name])
    unprintable = (control_problems(host_name, "vllm", data)
                   + control_problems(host_name, "vllm_defaults", defaults))
    if unprintable:
        raise SpecError(unprintable)
    if data is None:
        raise SpecError([f"{host_name}: vllm: missing (not a vLLM host: parse_inventory leaves it out)"])
    if not isinstance(data, Mapping):
        raise SpecError([f"{host_name}: vllm: {_given(data)} is not a dict"])
    if defaults is not None and not isinstance(defaults, Mapping):
        raise SpecError([f"{host_name}: vllm_defaults: {_given(defaults)} is not a dict"])
    if not data:
        raise SpecError([f"{host_name}: vllm: empty (a vLLM host needs at least a model; a host that is not "
                         "a vLLM host has no vllm key at all)"])
    merged = deep_merge(defaults or {}, data)
    host_keys, instance_keys = list(HostSpec.model_fields), list(InstanceSpec.model_fields)
    unknown = []
    for key in merged:
        if key not in host_keys and key not in instance_keys:
            hint = did_you_mean(key, host_keys + instance_keys)
            unknown.append(f"{host_name}: vllm.{key}: not a known key{hint} (host keys: "
                           f"{', '.join(host_keys)}; instance keys: {', '.join(instance_keys)})")
    if unknown:
        raise SpecError(unknown)
    # Instance-level keys at the top (model, flags, env, ...) are the one-instance shorthand, or, next to
    # `instances`, defaults that every instance inherits (group-wide flags in vllm_defaults).
    shared = {k: merged.pop(k) for k in list(merged) if k in InstanceSpec.model_fields}
    if "instances" not in merged:
        merged["instances"] = [shared] if shared else []
    elif isinstance(merged["instances"], list | tuple):
        merged["instances"] = [deep_merge(shared, i) if isinstance(i, Mapping) else i
                               for i in merged["instances"]]
    instances = merged["instances"]
    names = [i.get("name", "default") if isinstance(i, Mapping) else None
             for i in (instances if isinstance(instances, list) else [])]
    try:
        return HostSpec.model_validate(merged)
    except ValidationError as e:
        raise SpecError(problem_lines(host_name, "vllm", e, instance_labels(names))) from None


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
