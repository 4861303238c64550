"""`ServeFlags`: the one definition of every `vllm serve` flag this toolkit renders.

Each field carries its type and bounds (pydantic), the project's starting value (gpu-memory-utilization
0.90, max-num-seqs 256, block-size 16, port 8000, host 127.0.0.1, trust-remote-code off, enforce-eager off;
each field's docstring says how it compares with vLLM's own default), and the vLLM versions that accept it
(`since` / `removed`).
A value of None means "not set here": the planner derives it (dtype, tensor-parallel-size) or leaves
vLLM's own default in force (prefix caching and chunked prefill are on by default in the V1 engine).

Rendering goes through `render_flags()` only, so a flag the installed vLLM no longer has can never
reach a config file: `--swap-space` (removed in 0.18) is refused at validation with the alternatives.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator


def did_you_mean(given: object, options: Iterable[str], n: int = 3) -> str:
    """"; did you mean a, b?" for the names closest to a misspelt one, or "" when none is close: every
    refusal of an unknown key or flag says it the same way."""
    close = difflib.get_close_matches(str(given), list(options), n=n, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""

Scalar = str | int | float | bool
T = TypeVar("T")


def _tuple_as_list(v: Any) -> Any:
    """Strict mode takes only lists for a list, but `gpus=(0, 1)` is as natural in Python as `[0, 1]`;
    a tuple is accepted for list fields alone, and stored as a list so later code sees one type."""
    return list(v) if isinstance(v, tuple) else v


# A list field: a list or a tuple, each item strictly a T.
Seq = Annotated[list[T], BeforeValidator(_tuple_as_list)]


def _meta(since: str = "0.8.0", removed: str | None = None, platforms: tuple[str, ...] = ("cuda", "cpu"),
          planner: bool = False, negatable: bool = True):
    """negatable: vLLM has `--no-<flag>` for it (a BooleanOptionalAction), so "off" can be said."""
    return {"since": since, "removed": removed, "platforms": list(platforms), "planner": planner,
            "negatable": negatable}


def version_tuple(v: str) -> tuple[int, ...]:
    """'0.32.0+cpu' -> (0, 32, 0); enough for comparing vLLM releases."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def release_of(v: str) -> str:
    """'0.32.0+cpu' -> '0.32.0': the key the per-release data files use."""
    return ".".join(str(x) for x in version_tuple(v))


# The drain a restart gives in-flight requests: vLLM waits up to this long on SIGTERM, and the unit's
# TimeoutStopSec is this + 30 s. vLLM's own default (0) aborts them.
SHUTDOWN_TIMEOUT_S = 30


class ServeFlags(BaseModel):
    """Flags of one vLLM instance, as the operator may set them in the inventory (snake_case keys)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    # a field's docstring is its documentation: docs/inventory.md's tables are generated from it (keydoc.py)

    model: str | None = Field(None, json_schema_extra=_meta())
    """never set by hand

    default: derived
    from: model spec
    """
    served_model_name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$", json_schema_extra=_meta()
    )
    """the name clients ask for; vLLM's own default is the model's path on the host

    default: `model.name`
    from: the inventory: a short, stable name
    """
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(None, json_schema_extra=_meta())
    """`bfloat16` on compute capability ≥ 8.0, `float16` below; CPU: `bfloat16` with AVX2/AVX-512

    default: derived
    from: the planner, from the GPUs (vLLM's own `auto` follows the model's config)
    """
    quantization: Literal["awq", "gptq", "fp8", "compressed-tensors", "awq_marlin",
                          "gptq_marlin", "modelopt", "mxfp4"] | None = Field(
        None, json_schema_extra=_meta())
    """only for pre-quantized weights (`awq`, `gptq`, `fp8`, …)

    from: vLLM's default (unset: vLLM reads the checkpoint's own quantization config)
    """
    trust_remote_code: bool = Field(False, json_schema_extra=_meta())
    """on only when the model card says so

    from: vLLM's default
    """
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0, json_schema_extra=_meta(platforms=("cuda",)))
    """CUDA only; always rendered, so the memory preflight sizes with the value vLLM uses. vLLM's own
    default is 0.92 up to 0.33; 0.34 leaves it unset and resolves it at start (1.0 with its extensible KV
    cache, the default on CUDA, else 0.92), so 0.90 here leaves a tenth of the GPU to other processes

    from: the project's starting value, vLLM's before 0.92 became its default
    """
    max_model_len: int | None = Field(None, ge=16, le=10_485_760, json_schema_extra=_meta())
    """checked by the memory preflight; set it to what the application needs

    default: the model's
    from: vLLM's default
    """
    max_num_seqs: int = Field(256, ge=1, le=65_536, json_schema_extra=_meta())
    """the same on every host; vLLM 0.32's own depends on the hardware (256 on most GPUs, 1024 on GPUs of
    70 GiB or more other than A100, 128 per rank on CPU)

    from: the project's starting value
    """
    max_num_batched_tokens: int | None = Field(None, ge=16, le=10_485_760, json_schema_extra=_meta())
    """below `max_model_len` needs chunked prefill (refused otherwise)

    default: vLLM's
    from: vLLM's default
    """
    # The project's 16 suits CUDA; vLLM's CPU backend wants multiples of 32 (its default is 128), so on
    # CPU hosts the planner leaves it unset unless the inventory sets it.
    block_size: Literal[8, 16, 32, 64, 128, 256] | None = Field(None, json_schema_extra=_meta())
    """CPU backend wants multiples of 32

    default: `16` on CUDA, vLLM's (128) on CPU
    from: the project's starting value on CUDA
    """
    tensor_parallel_size: int | None = Field(None, ge=1, le=64, json_schema_extra=_meta())
    """the instance's GPUs if they divide the attention (and KV) heads, else the largest power of two that
    does, with a warning; an explicit value that does not divide is refused

    default: derived
    from: the planner, from the instance's GPUs (vLLM's own default is 1)
    """
    pipeline_parallel_size: int = Field(1, ge=1, le=64, json_schema_extra=_meta())
    """pipeline stages share the instance's GPUs

    from: vLLM's default
    """
    enable_prefix_caching: bool | None = Field(None, json_schema_extra=_meta())
    """rendered only when set

    default: vLLM's (on)
    from: vLLM's default
    """
    enable_chunked_prefill: bool | None = Field(None, json_schema_extra=_meta())
    """rendered only when set

    default: vLLM's (on)
    from: vLLM's default
    """
    enforce_eager: bool = Field(False, json_schema_extra=_meta())
    """trades CUDA graphs for memory; the lab sets it for faster CPU starts

    from: vLLM's default
    """
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] | None = Field(
        None, json_schema_extra=_meta())
    """`fp8*` halves the KV cache

    default: vLLM's (`auto`)
    """
    host: str = Field("127.0.0.1", json_schema_extra=_meta())
    """`0.0.0.0` for remote clients (needs a key)

    from: the project's starting value, local only unless asked; vLLM's own listens on every address
    """
    port: int = Field(8000, ge=1, le=65_535, json_schema_extra=_meta())
    """unique per host

    from: vLLM's default
    """
    shutdown_timeout: int | None = Field(SHUTDOWN_TIMEOUT_S, ge=0, le=3600,
                                         json_schema_extra=_meta(since="0.11.0"))
    """seconds vLLM lets in-flight requests finish on SIGTERM, so a restart cuts no stream;
    `TimeoutStopSec` is this + 30 s

    from: this toolkit (vLLM's own 0 aborts in-flight requests)
    """
    distributed_executor_backend: Literal["mp", "uni", "ray", "external_launcher"] | None = Field(
        None, json_schema_extra=_meta())
    """`mp`, `uni`, `ray`, `external_launcher`; cluster nodes need `mp` (refused otherwise)

    default: vLLM's
    """
    # Set by the planner from `vllm.cluster` (a model spanning nodes), never by hand: vLLM's own
    # multi-node mode for the mp executor (vLLM PR #23691, Oct 2025; read in 0.32.0's ParallelConfig).
    nnodes: int | None = Field(None, ge=2, le=1024, json_schema_extra=_meta(since="0.12.0", planner=True))
    """set by the planner for cluster nodes; refused in the inventory

    default: from `cluster`
    """
    node_rank: int | None = Field(None, ge=0, le=1023, json_schema_extra=_meta(since="0.12.0", planner=True))
    """set by the planner for cluster nodes; refused in the inventory

    default: from `cluster`
    """
    master_addr: str | None = Field(None, json_schema_extra=_meta(since="0.12.0", planner=True))
    """set by the planner for cluster nodes; refused in the inventory

    default: from `cluster`
    """
    master_port: int | None = Field(None, ge=1, le=65_535,
                                    json_schema_extra=_meta(since="0.12.0", planner=True))
    """set by the planner for cluster nodes; refused in the inventory

    default: from `cluster`
    """
    headless: bool | None = Field(None, json_schema_extra=_meta(since="0.12.0", planner=True,
                                                                negatable=False))
    """set by the planner for cluster nodes; refused in the inventory

    default: from `cluster`
    """
    # Checked pass-through for flags without a typed field: long names only, values scalar, validated by
    # the installed vLLM's own parser on the host before any restart.
    extra_args: dict[str, Scalar | Seq[Scalar]] = Field(default_factory=dict)
    """other long flags, checked by name here and parsed by the release's own vLLM before any restart"""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """Refuse unknown and removed keys with the closest valid names, before pydantic's own message."""
        if not isinstance(data, dict):
            return data
        normalised: dict[str, Any] = {}
        for k, v in data.items():
            key = str(k).replace("-", "_")
            if key in normalised:
                raise ValueError(f"@{key}: given twice (as {k!r} and in another spelling)")
            normalised[key] = v
        data = normalised
        for key in data:
            if key in REMOVED_FLAGS:
                raise ValueError(f"@{key}: {REMOVED_FLAGS[key]}")
            if key in SECRET_FLAGS:
                raise ValueError(f"@{key}: {SECRET_FLAGS[key]}")
            if key not in cls.model_fields:
                raise ValueError(f"@{key}: not a known serve flag{did_you_mean(key, cls.model_fields)} "
                                 "(others go in extra_args)")
            extra = cls.model_fields[key].json_schema_extra
            if isinstance(extra, dict) and extra.get("planner"):
                raise ValueError(f"@{key}: set by vllm-fleet from vllm.cluster (the node's rank and the "
                                 "head's address); describe the node group there instead")
        return data

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            if not re.fullmatch(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                                r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", v):
                raise ValueError(f"{v!r} is neither an IP address nor a host name") from None
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        typed = {f.replace("_", "-") for f in cls.model_fields}
        for name in v:
            flag = name.removeprefix("--").replace("_", "-")
            if not re.fullmatch(r"[a-z][a-z0-9-]*", flag):
                raise ValueError(f"@{name}: not a long flag name")
            if flag.removeprefix("no-") in typed and flag.removeprefix("no-") != flag:
                base = flag.removeprefix("no-")
                raise ValueError(f"@{name}: turns off {base}, which has a typed field: set "
                                 f"{base.replace('-', '_')}: False instead")
            for off, on in (("disable-", "enable-"), ("enable-", "disable-")):
                base = on + flag.removeprefix(off)
                if flag.startswith(off) and base in typed:  # 0.33's inverse alias of a typed flag
                    raise ValueError(f"@{name}: is {base} the other way round, which has a typed field: "
                                     f"set {base.replace('-', '_')} instead")
            flag = flag.removeprefix("no-")
            if flag in typed:
                raise ValueError(f"@{name}: has a typed field, set {flag.replace('-', '_')} instead")
            if flag.replace("-", "_") in REMOVED_FLAGS:
                raise ValueError(f"@{name}: {REMOVED_FLAGS[flag.replace('-', '_')]}")
            if flag.replace("-", "_") in SECRET_FLAGS:
                raise ValueError(f"@{name}: {SECRET_FLAGS[flag.replace('-', '_')]}")
            items = v[name] if isinstance(v[name], list) else [v[name]]
            dashed = [i for i in items if isinstance(i, str) and i.startswith("-")]
            if dashed:
                raise ValueError(f"@{name}: {dashed[0]!r} starts with '-': vLLM's config loader splices "
                                 "values into its argv, so it would be read as a flag of its own; give each "
                                 "flag its own key")
        return {n.removeprefix("--").replace("_", "-"): val for n, val in v.items()}

    @model_validator(mode="after")
    def _seed_rules(self) -> ServeFlags:
        """vLLM's own rule, checked here first: a batch budget below the context needs chunked prefill."""
        if (
            self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
            and self.enable_chunked_prefill is False
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_model_len "
                f"({self.max_model_len}) with enable_chunked_prefill off: a full-length prompt could never "
                "be scheduled; raise max_num_batched_tokens or turn chunked prefill on"
            )
        return self


REMOVED_FLAGS = {
    "swap_space": "removed in vLLM 0.18 (no replacement flag); delete it from the inventory. For CPU "
                  "offload see kv-offloading-size or cpu-offload-gb in extra_args",
}
SECRET_FLAGS = {
    "api_key": "a key is never written into the inventory: name the controller environment variable "
               "that holds it with api_key_env (default VLLM_API_KEY)",
    "hf_token": "a token is never written into the inventory: name the controller environment variable "
                "with hf_token_env",
    # the plan's key guard (vllm_fleet/host/keyguard.py) is the one middleware: another could run outside it
    "middleware": "set by vllm-fleet (its key guard, for an instance with an API key); open paths "
                  "without the key with open_paths",
    # a second server on the port that neither vLLM's key check nor the key guard covers
    "grpc": "serves vLLM's gRPC frontend, which checks no API key: not offered by vllm-fleet",
    "grpc_port": "serves vLLM's gRPC frontend, which checks no API key: not offered by vllm-fleet",
}


# extra_args that widen what any holder of the instance's key can read or make the server do, beyond
# running the model: refused unless the instance names them in `widen` (its acknowledgement), so the
# choice is written down where a reviewer of the inventory sees it (docs/security.md)
WIDENING_FLAGS = {
    "allowed-local-media-path": "lets every key holder have the server read files under that path (image, "
                                "audio and video inputs of a multimodal model), as the vllm user",
    "allowed-origins": "lets web pages of those origins call the API from a browser that holds a key",
    "allow-credentials": "lets browsers send cookies and authorization with cross-origin calls",
    "enable-log-requests": "writes every request's prompt into the journal, which more people read than "
                           "the API's clients",
    "tool-server": "lets the model call out to the tool servers named (MCP), on every key holder's behalf",
}


def flag_meta(name: str) -> dict[str, Any]:
    extra = ServeFlags.model_fields[name].json_schema_extra
    assert isinstance(extra, dict)
    return extra


def accepted_by(name: str, vllm_version: str, platform: str) -> bool:
    meta = flag_meta(name)
    v = version_tuple(vllm_version)
    if v < version_tuple(meta["since"]):
        return False
    if meta["removed"] and v >= version_tuple(meta["removed"]):
        return False
    return platform in meta["platforms"]


@cache
def parser_facts() -> dict[str, dict[str, Any]]:
    """How each release's parser turns a boolean off (vllm_fleet/data/parser.toml, read from the
    wheels by scripts/release_parser.py)."""
    return tomllib.loads(resources.files("vllm_fleet.data").joinpath("parser.toml").read_text())["release"]


@cache
def release_options(vllm_version: str) -> dict[str, dict[str, Any]] | None:
    """Every option string of that release's `vllm serve`, hidden ones included, with the setting each
    is (vllm_fleet/data/options/<release>.json, read by the release itself: scripts/release_options.py);
    None for a release that was not read."""
    name = release_of(vllm_version) + ".json"
    found = resources.files("vllm_fleet.data").joinpath("options").joinpath(name)
    return json.loads(found.read_text())["options"] if found.is_file() else None


def off_key(key: str, vllm_version: str) -> str:
    """The key that turns `key` off in that release's parser, as its help spells it: `disable-x` for
    `enable-x` (and `enable-x` for `disable-x`) where the release pairs them (0.33 on, whose `--no-`
    form is hidden, kept for backwards compatibility only), else `no-x`. A release without facts gets
    `no-x`, which every release read so far takes; the host check has the last word either way."""
    facts = parser_facts().get(release_of(vllm_version), {})
    for prefix, inverse in facts.get("inverse_prefixes", {}).items():
        if f"--{key}".startswith(prefix):
            return inverse.removeprefix("--") + f"--{key}".removeprefix(prefix)
    return f"no-{key}"


def field_of(key: str, value: object) -> tuple[str, object]:
    """A rendered key and value as the typed field they set: `no-enable-x: true` and `disable-x: true`
    are enable_x off (render_flags' spellings, read back)."""
    typed = {f.replace("_", "-") for f in ServeFlags.model_fields}
    if value is True:
        for off, on in (("no-", ""), ("disable-", "enable-"), ("enable-", "disable-")):
            base = on + key.removeprefix(off)
            if key.startswith(off) and base in typed:
                return base.replace("-", "_"), False
    return key.replace("-", "_"), value


def settings_of(rendered: Mapping[str, object]) -> dict[str, object]:
    """Rendered flags as the settings they are, kebab-case: `no-x: true` is x off, and a typed field's off
    form on a release that pairs its flags (`disable-prefix-caching: true`) is that field off."""
    out: dict[str, object] = {}
    for key, value in rendered.items():
        name, meant = field_of(key, value)
        setting = name.replace("_", "-")
        if setting == key and key.startswith("no-") and value is True:
            out[key.removeprefix("no-")] = False
        else:
            out[setting] = meant
    return out


def render_flags(flags: ServeFlags, vllm_version: str, platform: str) -> dict[str, Scalar | list[Scalar]]:
    """Kebab-case keys for `vllm serve --config`, in a stable order, without unset or unaccepted flags.

    "Off" is written as a flag of its own, `no-<flag>: true` or, where the release pairs them,
    `disable-<x>: true` (off_key): vLLM's config loader turns `<flag>: false` into `--no-<flag>` only
    when its top-level parser has that option, and only the `serve` subparser has it, so a plain
    `false` was dropped and vLLM's own default (prefix caching on) stayed in force. A typed flag without
    a `--no-` form (headless) is off by leaving it out; for an extra_args flag the installed vLLM
    decides, and the host check refuses an off form it has no such option for (leave it out then).
    """
    out: dict[str, Scalar | list[Scalar]] = {}
    for name in ServeFlags.model_fields:
        if name == "extra_args":
            continue
        value = getattr(flags, name)
        if value is None or not accepted_by(name, vllm_version, platform):
            continue
        put_flag(out, name.replace("_", "-"), value, flag_meta(name)["negatable"], vllm_version)
    for key, value in flags.extra_args.items():
        # off stays `no-<key>`: an inverse alias is another option's name, which the inventory's checks
        # (widen) never saw; the plan and the host check refuse `no-<key>` where the release lacks it
        put_flag(out, key, value, True, None)
    return out


def put_flag(out: dict[str, Scalar | list[Scalar]], key: str, value: Scalar | list[Scalar],
             negatable: bool, vllm_version: str | None) -> None:
    """One flag as render_flags writes it: off as its release's off key (`no-<key>` without a release),
    or left out (not negatable)."""
    if value is False:
        if negatable:
            out[off_key(key, vllm_version) if vllm_version else f"no-{key}"] = True
        return
    out[key] = value
