"""What vLLM refuses when it starts, decided on the controller before any host is touched.

Why this exists
---------------
The host-side check (vllm_fleet/host/validate_serve.py) builds vLLM's engine config on the host, but only once
the release is installed and the model is on the host's disk, and much of what vLLM refuses is decided
later still: in the GPU worker (bfloat16 support, the attention backend, the KV cache's block size) or
in the API server (binding its port). Each of those is a unit in a crash loop after the restart; here
they are found when the plan is made, before any host is touched. Every
check here mirrors one refusal in vLLM's own code for the releases of vllm_fleet/data/variants.toml
(0.31.0-0.33.0, read from their wheels; docs/startup-refusals.md has the table with vLLM's messages and
where each is caught), and decides it from what the plan already knows: the model's config.json, the
GPUs' compute capability and memory, the CPU flags, and the host's ports (the VllmHost fact).

A check that cannot be decided (no config.json for a hub model, a fact that was not read, a model
family whose rules differ) says nothing: a refusal here must be one vLLM would make, never a guess.

Pure: the only I/O is reading the packaged table vllm_fleet/data/quantization.toml.

Messages: ``<host>: vllm.instances[<name>].flags.<field>: <what vLLM refuses, with its words>;
allowed: <values>``; ``startup_refusals`` returns them all, the planner raises them as one SpecError.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from vllm_fleet.core import sizing
from vllm_fleet.core.flags import (
    ServeFlags,
    did_you_mean,
    release_of,
    release_options,
    settings_of,
    version_tuple,
)
from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.modelinfo import (
    ContextLength,
    ModelInfo,
    ModelInfoError,
    context_length,
    from_config,
    text_config,
)

if TYPE_CHECKING:
    from vllm_fleet.core.hostfacts import VllmHostFacts

FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (same in 0.31.0-0.33.0)
FLOAT16_REFUSED = {"gemma2", "gemma3", "gemma3_text", "glm4"}
# vllm/v1/attention/backends/flashinfer.py get_supported_head_sizes: the only backend that runs an fp8 KV
# cache on compute capability 8.0-8.8 (FlashAttention 2 has no fp8 KV, Triton's needs 8.9)
FLASHINFER_HEAD_SIZES = (64, 128, 256, 512)
GiB = 1 << 30
VLLM_UNIT = re.compile(r"^vllm-.+\.service$")
TYPED = set(ServeFlags.model_fields)


# --- host facts -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Listener:
    """One listening TCP socket on the host (``ss -ltnp`` via the VllmHost fact)."""

    address: str  # "0.0.0.0", "::" (IPv6 only), "*" (IPv4 and IPv6), or a specific address
    port: int
    process: str | None = None
    pid: int | None = None
    unit: str | None = None  # the systemd service whose cgroup holds the process

    @property
    def owner_known(self) -> bool:
        return self.pid is not None

    @property
    def ours(self) -> bool:
        """A vllm-*.service unit of this toolkit: a restart frees its port, so it is no conflict."""
        return bool(self.unit and VLLM_UNIT.match(self.unit))

    def describe(self) -> str:
        who = self.process or "a process"
        extra = ", ".join(x for x in (f"pid {self.pid}" if self.pid else "", self.unit or "") if x)
        shown = f"[{self.address}]" if ":" in self.address else self.address
        return f"{who} ({extra}) on {shown}:{self.port}" if extra else f"{who} on {shown}:{self.port}"


@dataclass(frozen=True)
class HostPorts:
    """What decides whether vLLM can bind its port: the lowest port an unprivileged user may bind, who
    already listens where, and the host's own addresses. ``listeners`` None: not read (no ``ss``)."""

    unprivileged_port_start: int | None = None
    listeners: tuple[Listener, ...] | None = None
    addresses: frozenset[str] = frozenset()

    @classmethod
    def from_fact(cls, vh: VllmHostFacts) -> HostPorts:
        """From vllm_fleet.roles.facts.VllmHost's output; keys a fact of an older toolkit lacks read as
        unknown."""
        raw = vh.get("listeners")
        listeners = None if raw is None else tuple(
            Listener(str(x["address"]), int(x["port"]), x.get("process"), x.get("pid"), x.get("unit"))
            for x in raw)
        return cls(vh.get("unprivileged_port_start"), listeners, frozenset(vh.get("interfaces") or {}))


# --- the packaged quantization table ---------------------------------------------------------------------
@dataclass(frozen=True)
class QuantConfig:
    name: str
    cls: str
    min_capability: int
    act_dtypes: tuple[str, ...]
    needs_checkpoint: bool


@dataclass(frozen=True)
class QuantTable:
    methods: Mapping[str, tuple[str, ...]]  # release -> QuantizationMethods
    deprecated: Mapping[str, tuple[str, ...]]
    checkpoint: Mapping[str, Mapping[str, tuple[str, ...]]]  # quant_method -> platform -> accepted flags
    configs: Mapping[str, QuantConfig]


def parse_quant_table(text: str) -> QuantTable:
    data = tomllib.loads(text)
    releases = data.get("release", {})
    return QuantTable(
        methods={v: tuple(r["methods"]) for v, r in releases.items()},
        deprecated={v: tuple(r.get("deprecated", ())) for v, r in releases.items()},
        checkpoint={m: {p: tuple(a) for p, a in by.items()} for m, by in data.get("checkpoint", {}).items()},
        configs={k: QuantConfig(k, c["class"], int(c["min_capability"]), tuple(c["act_dtypes"]),
                                bool(c["needs_checkpoint"])) for k, c in data.get("config", {}).items()},
    )


@cache
def quant_table() -> QuantTable:
    return parse_quant_table(resources.files("vllm_fleet").joinpath("data", "quantization.toml")
                             .read_text(encoding="utf-8"))


# --- the checks -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Inputs:
    """One instance as the checks see it: the rendered flags and what is known of model and host."""

    host: str
    inst_name: str
    # rendered, read as settings: `no-x: true` and (0.33 on) `disable-x: true` are x off (flags.settings_of)
    flags: Mapping[str, Any]
    version: str
    accelerator: str
    gpus: tuple[Gpu, ...]
    model_config: Mapping[str, Any] | None
    cpu_flags: frozenset[str]
    environment: Mapping[str, str]
    ports: HostPorts | None
    info: ModelInfo | None = field(default=None)
    rendered: tuple[str, ...] = ()  # the rendered keys as written, for the option check

    def where(self, name: str) -> str:
        """The inventory path of a flag: a typed field, or an extra_args entry."""
        snake = name.replace("-", "_")
        path = f"flags.{snake}" if snake in TYPED else f"flags.extra_args.{name}"
        return f"{self.host}: vllm.instances[{self.inst_name}].{path}"

    def get(self, name: str, default: Any = None) -> Any:
        return self.flags.get(name, default)

    def on(self, name: str) -> bool:
        """A boolean flag as vLLM's config loader reads it (``x: true`` -> ``--x``)."""
        value = self.flags.get(name)
        return value is True or str(value).lower() in ("true", "1", "yes")

    @property
    def release(self) -> str:
        return release_of(self.version)

    @property
    def vllm(self) -> str:
        return f"vLLM {self.release}"

    @property
    def cuda(self) -> bool:
        return self.accelerator == "cuda"

    @property
    def model_type(self) -> str | None:
        return str(self.model_config.get("model_type")) if self.model_config and \
            self.model_config.get("model_type") else None

    @property
    def use_mla(self) -> bool | None:
        return None if self.info is None else self.info.use_mla

    @property
    def hybrid(self) -> bool:
        """Linear-attention / Mamba layers: vLLM re-aligns the block size for them, so block rules differ."""
        cfg = text_config(self.model_config or {})
        types = cfg.get("layer_types")
        kinds = {str(t) for t in types} if isinstance(types, list) else set()
        return bool(kinds - {"full_attention", "sliding_attention", "chunked_attention", "attention"}) or \
            any(k in cfg for k in ("mamba_d_state", "ssm_state_size", "linear_attn_config"))

    @property
    def checkpoint_method(self) -> str | None:
        """quantization_config.quant_method as vLLM normalises it (lower case, compressed-tensors)."""
        method = self.info.quantization if self.info else None
        return method.replace("compressed_tensors", "compressed-tensors") if method else None

    @property
    def dtype(self) -> str:
        d = str(self.get("dtype", "auto"))
        return {"half": "float16", "float": "float32"}.get(d, d)

    def min_gpu(self) -> Gpu | None:
        return min(self.gpus, key=lambda g: g.compute_capability) if self.gpus else None

    def context(self) -> ContextLength | None:
        if not self.model_config or "hf-overrides" in self.flags or self.model_type == "moss_audio":
            return None  # overrides can change every length key; MossAudio derives its own
        return context_length(self.model_config, disable_sliding_window=self.on("disable-sliding-window"))

    def max_model_len(self) -> int | None:
        """The max_model_len vLLM runs with: the flag, or the model's default when the flag is unset."""
        if self.get("max-model-len") is not None:
            return int(self.get("max-model-len"))
        ctx = self.context()
        return ctx.default if ctx else None


Check = Callable[[Inputs], list[str]]


def check_quantization_method(x: Inputs) -> list[str]:
    """ModelConfig._verify_quantization: "Unknown quantization method: X. Must be one of [...]" for the
    flag and for a checkpoint's quant_method alike."""
    methods = quant_table().methods.get(x.release)
    if methods is None:
        return []
    out = []
    flag = x.get("quantization")
    if flag is not None and str(flag).lower() not in methods:
        out.append(f"{x.where('quantization')}: {x.vllm} refuses {flag!r} at start-up (\"Unknown "
                   f"quantization method: {flag}. Must be one of [...]\"); allowed: {', '.join(methods)}")
    ckpt = x.checkpoint_method
    if ckpt and ckpt not in methods:
        out.append(f"{x.host}: vllm.instances[{x.inst_name}].model: its config.json has quantization_config."
                   f"quant_method {ckpt!r}, which {x.vllm} refuses at start-up (\"Unknown quantization "
                   f"method: {ckpt}\"); allowed: a checkpoint quantized with one of {', '.join(methods)}")
    return out


def check_quantization_checkpoint(x: Inputs) -> list[str]:
    """ModelConfig._verify_quantization: a flag that differs from the checkpoint's quant_method, unless an
    override of that method claims the flag (table in quantization.toml)."""
    flag, ckpt = x.get("quantization"), x.checkpoint_method
    if flag is None or ckpt is None:
        return []
    accepted = quant_table().checkpoint.get(ckpt, {}).get(x.accelerator)
    flag = str(flag).lower()
    if accepted is None or flag in accepted:
        return []
    return [f"{x.where('quantization')}: the model is a {ckpt} checkpoint and {x.vllm} refuses {flag!r} with "
            f"it (\"Quantization method specified in the model config ({ckpt}) does not match the "
            f"quantization method specified in the `quantization` argument ({flag})\"); allowed: "
            f"{', '.join(accepted)}, or leave quantization unset (vLLM reads it from the checkpoint)"]


def _effective_quant(x: Inputs) -> QuantConfig | None:
    """The QuantizationConfig vLLM will build, when the table knows it."""
    configs = quant_table().configs
    ckpt = x.checkpoint_method
    if ckpt == "modelopt":
        qcfg = (x.model_config or {}).get("quantization_config") or {}
        algo = str(qcfg.get("quant_algo") or (qcfg.get("quantization") or {}).get("quant_algo") or "").upper()
        return configs.get("modelopt_fp4" if "FP4" in algo and "MXFP" not in algo else
                           "modelopt" if algo.startswith("FP8") else "")
    if ckpt:
        return configs.get(ckpt)
    flag = x.get("quantization")
    if flag is None:
        return None
    flag = str(flag).lower()
    return configs.get(f"{flag}+online") or configs.get(flag)


def _vllm_quant_name(x: Inputs) -> str:
    """The method name vLLM's messages print: the override's name where one claims the checkpoint."""
    ckpt = x.checkpoint_method
    if ckpt == "gptq" or (ckpt == "awq" and x.cuda):
        return f"auto_{ckpt}"
    return str(ckpt or x.get("quantization"))


def check_quantization_deprecated(x: Inputs) -> list[str]:
    """ModelConfig._verify_quantization: a deprecated method (Meta's fbgemm_fp8 checkpoints) unless
    --allow-deprecated-quantization."""
    deprecated = quant_table().deprecated.get(x.release, ())
    ckpt, flag = x.checkpoint_method, x.get("quantization")
    method = ckpt or (str(flag).lower() if flag else None)
    if method not in deprecated or x.on("allow-deprecated-quantization"):
        return []
    where = f"{x.host}: vllm.instances[{x.inst_name}].model" if ckpt else x.where("quantization")
    what = f"the model is a {method} checkpoint" if ckpt else f"{method} is deprecated"
    return [f"{where}: {what}, and {x.vllm} refuses to start with it (\"The quantization method {method} is "
            f"deprecated and will be removed in future versions of vLLM. To bypass, set "
            f"`--allow-deprecated-quantization`.\"); allowed: extra_args allow-deprecated-quantization: "
            f"true, or a checkpoint in one of the current methods"]


def check_quantization_gpu(x: Inputs) -> list[str]:
    """VllmConfig._get_quantization_config: "The quantization method X is not supported for the current
    GPU. Minimum capability: N. Current capability: M." """
    q, gpu = _effective_quant(x), x.min_gpu()
    if not x.cuda or q is None or gpu is None:
        return []
    cc = gpu.compute_capability[0] * 10 + gpu.compute_capability[1]
    if cc >= q.min_capability:
        return []
    name = _vllm_quant_name(x)
    return [f"{x.where('quantization')}: {x.vllm} refuses {name} ({q.cls}) on {gpu.label} (\"The "
            f"quantization method {name} is not supported for the current GPU. Minimum capability: "
            f"{q.min_capability}. "
            f"Current capability: {cc}.\"); allowed: GPUs of compute capability "
            f"{q.min_capability // 10}.{q.min_capability % 10} or newer, or another quantization"]


def check_quantization_dtype(x: Inputs) -> list[str]:
    """VllmConfig._get_quantization_config: "<dtype> is not supported for quantization method X"."""
    q = _effective_quant(x)
    if q is None or x.dtype == "auto" or x.dtype in q.act_dtypes:
        return []
    name = _vllm_quant_name(x)
    return [f"{x.where('dtype')}: {x.vllm} refuses dtype {x.dtype} with {name} (\"torch.{x.dtype} is not "
            f"supported for quantization method {name}. Supported dtypes: [...]\"); allowed: "
            f"{', '.join(q.act_dtypes)}"]


def check_max_model_len(x: Inputs) -> list[str]:
    """_get_and_verify_max_len: "User-specified max_model_len (N) is greater than the derived max_model_len
    (key=M or model_max_length=None in model's config.json)", unless VLLM_ALLOW_LONG_MAX_MODEL_LEN."""
    asked = x.get("max-model-len")
    ctx = x.context()
    if asked is None or ctx is None or int(asked) <= ctx.limit:
        return []
    if ctx.model_max_length is not None and int(asked) <= ctx.model_max_length:
        return []
    if x.environment.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true"):
        return []
    rope = f", RoPE factor {ctx.rope_factor:g} applied" if ctx.rope_factor != 1.0 else ""
    if ctx.yarn:
        rope = ("; YaRN's factor is not applied, vLLM reads max_position_embeddings as the scaled length, "
                "so raise it in config.json to serve the extended context")
    return [f"{x.where('max-model-len')}: {asked} is more than the {ctx.limit} vLLM derives from the model's "
            f"config.json ({ctx.key}{rope}), and {x.vllm} refuses it at start-up (\"User-specified "
            f"max_model_len ({asked}) is greater than the derived max_model_len ...\"); allowed: up to "
            f"{ctx.limit} (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the instance's env lifts the limit at the "
            f"model's risk)"]


def check_dtype_model(x: Inputs) -> list[str]:
    """_check_valid_dtype: "The model type 'gemma2' does not support float16"."""
    if x.dtype != "float16" or x.model_type not in FLOAT16_REFUSED:
        return []
    cuda_note = ""
    gpu = x.min_gpu()
    if x.cuda and gpu is not None and gpu.compute_capability < (8, 0):
        cuda_note = f" ({gpu.label} has no bfloat16, so only float32 runs it there)"
    allowed = "float32" if cuda_note else "bfloat16, float32"
    return [f"{x.where('dtype')}: {x.vllm} refuses float16 for model type {x.model_type!r} (\"The model type "
            f"'{x.model_type}' does not support float16. Reason: Numerical instability.\"){cuda_note}; "
            f"allowed: {allowed}"]


def check_dtype_gpu(x: Inputs) -> list[str]:
    """CudaPlatformBase.check_if_supports_dtype, run by each GPU worker: bfloat16 needs 8.0."""
    gpu = x.min_gpu()
    if not x.cuda or x.dtype != "bfloat16" or gpu is None or gpu.compute_capability >= (8, 0):
        return []
    return [f"{x.where('dtype')}: {x.vllm}'s GPU worker refuses bfloat16 on {gpu.label} (\"Bfloat16 is only "
            f"supported on GPUs with compute capability of at least 8.0. Your {gpu.name} GPU has compute "
            f"capability {gpu.cc}.\"); allowed: float16, float32 (or leave dtype unset)"]


def check_kv_cache_dtype_gpu(x: Inputs) -> list[str]:
    """CUDA attention backends: below 8.0 only Triton runs, and TritonAttentionImpl refuses an fp8 KV cache
    below 8.9; from 8.0 to 8.8 FlashInfer takes it, for its head sizes and 16-bit dtypes only."""
    kv, gpu = x.get("kv-cache-dtype"), x.min_gpu()
    if not x.cuda or kv not in FP8_KV or gpu is None or x.info is None or x.info.use_mla:
        return []
    cc = gpu.compute_capability
    if cc >= (8, 9):
        return []
    if cc >= (8, 0) and x.info.head_dim in FLASHINFER_HEAD_SIZES and x.dtype != "float32":
        return []
    why = "" if cc < (8, 0) else (f" (FlashInfer, the fp8 KV backend below 8.9, takes head sizes "
                                  f"{'/'.join(map(str, FLASHINFER_HEAD_SIZES))} in float16/bfloat16; this "
                                  f"model has head_dim {x.info.head_dim}, dtype {x.dtype})")
    suggested = "bfloat16" if cc >= (8, 0) else "float16"
    return [f"{x.where('kv-cache-dtype')}: {x.vllm} falls back to the Triton backend on {gpu.label}{why}, "
            f"which refuses it (\"FP8 KV cache is not supported by the Triton attention backend on "
            f"{gpu.name} (compute capability {gpu.cc}); native FP8 (fp8e4nv) requires SM89+.\"); "
            f"allowed: auto (or {suggested}), or GPUs of compute capability 8.9 or newer"]


def check_kv_cache_dtype_cpu(x: Inputs) -> list[str]:
    """The CPU attention backend: fp8 KV needs AVX-512 or AMX and a head size divisible by 32 (_get_attn_isa);
    0.33 also refuses it for MLA models (CpuPlatform.get_attn_backend_cls)."""
    kv = x.get("kv-cache-dtype")
    if x.cuda or kv not in FP8_KV:
        return []
    where, v33 = x.where("kv-cache-dtype"), version_tuple(x.release) >= (0, 33)
    if x.use_mla:
        if v33:
            return [f"{where}: {x.vllm} refuses {kv} for this MLA model on CPU (\"--kv-cache-dtype {kv} "
                    f"is not supported by MLA attention on CPU.\"); allowed: auto"]
        return []
    if x.cpu_flags and not ({"avx512f", "amx_tile"} & x.cpu_flags):
        said = (f"--kv-cache-dtype {kv} is not supported by the CPU attention backend on this host." if v33
                else "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.")
        return [f"{where}: this host's CPU has neither AVX-512 nor AMX, and {x.vllm} refuses an fp8 KV cache "
                f"without them (\"{said}\"); allowed: auto"]
    head = x.info.head_dim if x.info else None
    if head is not None and head % 32 and head % 16 == 0:
        return [f"{where}: the model's head_dim is {head}, and {x.vllm}'s CPU backend refuses an fp8 KV "
                f"cache for it (\"FP8 KV cache requires head_size divisible by 32 on CPU.\"); allowed: auto"]
    return []


def _default_batched_tokens(x: Inputs, world: int) -> int | None:
    """EngineArgs.get_batch_defaults for the OpenAI server, before the chunked-prefill adjustments."""
    if not x.cuda:
        return sizing.CPU_BATCHED_TOKENS_PER_RANK * world
    gpu = x.gpus[0] if x.gpus else None
    if gpu is None:
        return None
    return sizing.default_max_num_batched_tokens(gpu.memory_mib, gpu.name, gpu.compute_capability,
                                                 gb10_small=version_tuple(x.release) >= (0, 33))


def check_batched_tokens(x: Inputs) -> list[str]:
    """SchedulerConfig.verify_max_model_len: max_num_batched_tokens against max_num_seqs and, with chunked
    prefill off, against max_model_len, including vLLM's own default when the flag is unset."""
    seqs = x.get("max-num-seqs")
    if seqs is None:
        return []
    seqs, max_len = int(seqs), x.max_model_len()
    chunked_off = x.get("enable-chunked-prefill") is False
    out = []
    set_mnbt = x.get("max-num-batched-tokens")
    if set_mnbt is not None:
        mnbt, whose = int(set_mnbt), ""
    else:
        multimodal = any(k in (x.model_config or {}) for k in ("vision_config", "audio_config"))
        world = int(x.get("tensor-parallel-size") or 1) * int(x.get("pipeline-parallel-size") or 1)
        default = None if multimodal else _default_batched_tokens(x, world)
        if default is None:
            return []
        if str(x.get("performance-mode", "")) == "throughput":
            default *= 2
        if chunked_off:
            if max_len is None:
                return []
            default = max(default, max_len)
        mnbt, whose = default, f" (vLLM's default here, {'CPU' if not x.cuda else 'this GPU'})"
    if mnbt < seqs:
        fix = "raise max_num_batched_tokens" if set_mnbt is not None else "set max_num_batched_tokens"
        out.append(f"{x.where('max-num-seqs')}: {seqs} is more than max_num_batched_tokens {mnbt}{whose}, "
                   f"and {x.vllm} refuses it (\"max_num_batched_tokens ({mnbt}) must be greater than or "
                   f"equal to max_num_seqs ({seqs}).\"); allowed: max_num_seqs up to {mnbt}, or {fix} to at "
                   f"least {seqs}")
    if set_mnbt is not None and chunked_off and max_len is not None and mnbt < max_len:
        out.append(f"{x.where('max-num-batched-tokens')}: {mnbt} is below max_model_len {max_len} with "
                   f"chunked prefill off, and {x.vllm} refuses it (\"max_num_batched_tokens ({mnbt}) is "
                   f"smaller than max_model_len ({max_len}).\"); allowed: at least {max_len}, or "
                   f"enable_chunked_prefill on")
    return out


def check_scheduler_extra(x: Inputs) -> list[str]:
    """SchedulerConfig.verify_max_model_len for the scheduler's extra_args."""
    out = []
    threshold, max_len = x.get("long-prefill-token-threshold"), x.max_model_len()
    if threshold is not None and max_len is not None and int(threshold) > max_len:
        out.append(f"{x.where('long-prefill-token-threshold')}: {threshold} is more than max_model_len "
                   f"{max_len}, and {x.vllm} refuses it (\"long_prefill_token_threshold ({threshold}) cannot "
                   f"be greater than the max_model_len ({max_len}).\"); allowed: 0-{max_len}")
    active, seqs = x.get("max-num-active-seqs"), x.get("max-num-seqs")
    if active is not None and seqs is not None and int(active) > int(seqs):
        out.append(f"{x.where('max-num-active-seqs')}: {active} is more than max_num_seqs {seqs}, and "
                   f"{x.vllm} refuses it (\"max_num_active_seqs ({active}) cannot be greater than "
                   f"max_num_seqs ({seqs}).\"); allowed: 1-{seqs}")
    return out


def check_block_size(x: Inputs) -> list[str]:
    """The attention backends' kernel block sizes: every CUDA backend needs a multiple of 16 ("No valid
    attention backend found"), the CPU backend a multiple of 32 (select_common_block_size: "No common
    block size for 16 (CPU_ATTN: [MultipleOf(32)])"). CPU MLA models get 16 from vLLM itself."""
    bs = x.get("block-size")
    if bs is None or x.model_config is None or x.hybrid:
        return []
    bs = int(bs)
    if x.cuda and bs % 16:
        return [f"{x.where('block-size')}: {bs} is not a multiple of 16, which every CUDA attention backend "
                f"of {x.vllm} needs (\"No valid attention backend found for cuda ... block_size not "
                f"supported\"); allowed: 16, 32, 64, 128, 256"]
    if not x.cuda and bs % 32 and x.use_mla is False and x.model_type != "deepseek_v4":
        return [f"{x.where('block-size')}: {bs} is not a multiple of 32, and {x.vllm}'s CPU attention "
                f"backend refuses it when it sets up the KV cache (\"No common block size for {bs} "
                f"(CPU_ATTN: [MultipleOf(32)]).\"); allowed: 32, 64, 128, 256 (or leave it unset: 128)"]
    return []


def _addr(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _bind_conflicts(bind: str, listener: str) -> bool:
    """Linux refuses the bind with EADDRINUSE when a listening socket on the same port overlaps it."""
    b = _addr("127.0.0.1" if bind == "localhost" else bind)
    if b is None:
        return listener == "*"  # a host name: only a listener on every address surely overlaps
    if listener == "*":
        return True
    la = _addr(listener)
    if la is None:
        return False
    if isinstance(la, ipaddress.IPv6Address) and la.ipv4_mapped:
        la = la.ipv4_mapped
    if isinstance(b, ipaddress.IPv4Address):
        return isinstance(la, ipaddress.IPv4Address) and (la == b or la.is_unspecified or b.is_unspecified)
    if b.is_unspecified:  # vLLM's [::] socket is dual-stack: it also takes every IPv4 address
        return True
    return isinstance(la, ipaddress.IPv6Address) and (la == b or la.is_unspecified)


def _port_users(x: Inputs, bind: str, port: int) -> list[Listener]:
    if x.ports is None or x.ports.listeners is None:
        return []
    return [li for li in x.ports.listeners
            if li.port == port and li.owner_known and not li.ours and _bind_conflicts(bind, li.address)]


def check_port(x: Inputs) -> list[str]:
    """The API server binds its port before the engine starts (create_server_socket): below
    ip_unprivileged_port_start the unit, user vllm with no capabilities, gets EACCES; a port another
    service listens on gives EADDRINUSE."""
    if x.ports is None or x.on("headless") or x.get("port") is None:
        return []
    port, bind = int(x.get("port")), str(x.get("host", "0.0.0.0"))
    out = []
    start = x.ports.unprivileged_port_start
    floor = 1024 if start is None else int(start)
    if port < floor:
        src = (f"net.ipv4.ip_unprivileged_port_start is {start} here" if start is not None else
               "the kernel has no net.ipv4.ip_unprivileged_port_start, so ports below 1024 need a capability")
        out.append(f"{x.where('port')}: {port} is below {floor} ({src}); the unit runs as user vllm with an "
                   f"empty CapabilityBoundingSet, so {x.vllm} cannot bind it (\"[Errno 13] Permission "
                   f"denied\"); allowed: {floor}-65535, or lower net.ipv4.ip_unprivileged_port_start on the "
                   f"host")
    users = _port_users(x, bind, port)
    if users:
        out.append(f"{x.where('port')}: {port} on {bind} is already listened on by "
                   f"{'; '.join(u.describe() for u in users)}, so {x.vllm} cannot bind it (\"[Errno 98] "
                   f"Address already in use\"); allowed: a port no other service listens on")
    return out


def check_host_address(x: Inputs) -> list[str]:
    """create_server_socket binds the host flag as given: an address this host does not have fails with
    EADDRNOTAVAIL."""
    bind = str(x.get("host", ""))
    a = _addr(bind)
    if x.ports is None or not x.ports.addresses or a is None or a.is_unspecified or a.is_loopback:
        return []
    have = {_addr(h) for h in x.ports.addresses}
    if a in have:
        return []
    shown = ", ".join(sorted(x.ports.addresses))
    return [f"{x.where('host')}: {bind} is not an address of this host, so {x.vllm} cannot bind it "
            f"(\"[Errno 99] Cannot assign requested address\"); allowed: 127.0.0.1, 0.0.0.0, ::, or one "
            f"of {shown}"]


def check_master_port(x: Inputs) -> list[str]:
    """The head node's torch.distributed store listens on master_port (init_distributed_environment with
    nnodes > 1): a port another service holds fails the group with EADDRINUSE."""
    port, rank = x.get("master-port"), x.get("node-rank")
    if port is None or (rank not in (None, 0)) or x.get("master-addr") is None:
        return []
    # torch's TCPStore server listens on every local address, not only master_addr
    users = _port_users(x, "::", int(port))
    if not users:
        return []
    return [f"{x.host}: vllm.cluster.master_port: {port} on {x.get('master-addr')} is already listened on by "
            f"{'; '.join(u.describe() for u in users)}, so the head's torch.distributed store cannot listen "
            f"(\"EADDRINUSE\"); allowed: a port no other service listens on"]


def check_executor(x: Inputs) -> list[str]:
    """ParallelConfig._verify_args needs Ray for 'ray' (never installed by this toolkit: vLLM has it as
    an extra only); ExecutorWithExternalLauncher reads RANK and LOCAL_RANK, which torchrun sets and
    systemd does not."""
    backend = x.get("distributed-executor-backend")
    where = x.where("distributed-executor-backend")
    if backend == "ray":
        return [f"{where}: 'ray' needs Ray, which vllm-fleet does not install into releases (vLLM lists it "
                f"as an extra), so {x.vllm} refuses it (\"Failed to import Ray: No module named 'ray'.Please "
                f"install Ray with `pip install ray`.\"); allowed: mp, uni, or unset"]
    if backend == "external_launcher":
        missing = [v for v in ("RANK", "LOCAL_RANK") if v not in x.environment]
        if missing:
            return [f"{where}: 'external_launcher' is for torchrun, which sets {', '.join(missing)}; under "
                    f"systemd {x.vllm}'s executor fails on start (KeyError: '{missing[0]}'); allowed: mp, "
                    f"uni, or unset"]
    return []


def check_known_options(x: Inputs) -> list[str]:
    """vLLM's parser stops at an option it does not have (\"unrecognized arguments\"), and the host check
    refuses it ("vLLM does not know these flags"): decided here from the release's own option list
    (flags.release_options), before any host is touched. A release not read is left to the host check."""
    options = release_options(x.version)
    if options is None:
        return []
    return [f"{x.where(key)}: {x.vllm} has no --{key}{did_you_mean(key, options)}; allowed: an option of "
            f"{x.vllm}'s `vllm serve`"
            for key in x.rendered if key not in options]


CHECKS: tuple[Check, ...] = (
    check_known_options,
    check_quantization_method, check_quantization_checkpoint, check_quantization_deprecated,
    check_quantization_gpu, check_quantization_dtype, check_max_model_len, check_dtype_model,
    check_dtype_gpu, check_kv_cache_dtype_gpu, check_kv_cache_dtype_cpu, check_batched_tokens,
    check_scheduler_extra, check_block_size, check_port, check_host_address, check_master_port,
    check_executor,
)


def startup_refusals(host: str, inst_name: str, flags: Mapping[str, Any], *, vllm_version: str,
                     accelerator: str, gpus: Sequence[Gpu] = (),
                     model_config: Mapping[str, Any] | None = None,
                     cpu_flags: Collection[str] = frozenset(),
                     environment: Mapping[str, str] | None = None,
                     ports: HostPorts | None = None) -> list[str]:
    """Every refusal vLLM would make at start-up that the plan can decide, one line each; [] when none.

    ``flags`` are the instance's rendered flags (InstancePlan.flags: kebab-case, planner values and
    extra_args included, off written as the release spells it, ``no-x`` or ``disable-x``: exactly what
    vLLM reads); ``gpus`` the instance's GPUs (CUDA_VISIBLE_DEVICES order); ``model_config`` its
    config.json (None for hub models: the model checks are skipped); ``cpu_flags`` /proc/cpuinfo's
    flags; ``environment`` the unit's environment; ``ports`` the host's ports (None: the port checks
    are skipped).
    """
    info = None
    if model_config:
        try:
            info = from_config(model_config)
        except ModelInfoError:
            info = None
    x = Inputs(host, inst_name, settings_of(flags), vllm_version, accelerator, tuple(gpus), model_config,
               frozenset(cpu_flags), environment or {}, ports, info, tuple(flags))
    return [line for check in CHECKS for line in check(x)]
