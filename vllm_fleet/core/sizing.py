"""Memory preflight: will vLLM start with these settings on this GPU, computed on the controller.

Why
---
vLLM sizes its KV cache at startup: it loads the weights, runs one profiling forward pass of
``max_num_batched_tokens`` tokens (plus a dummy sampler pass over ``max_num_seqs`` rows), captures CUDA
graphs, and gives whatever is left of ``memory.total x gpu_memory_utilization`` to the KV cache. If that
rest cannot hold ONE sequence of ``max_model_len`` tokens it refuses to start ("ValueError: To serve at
least one request with the models's max seq len (...), (... GiB KV cache is needed, which is larger than
the available KV cache memory ...", in older releases "The model's max seq len (...) is larger than the
maximum number of tokens that can be stored in KV cache (...)"). On a fleet that refusal shows up as a
unit in a crash loop minutes after a deploy. The same arithmetic, done here from config.json and the
weight headers (``vllm_fleet.core.modelinfo``), finds it in microseconds and says which single change fixes
it.

Holding fewer than ``max_num_seqs`` full-length sequences is not a refusal: vLLM starts and runs at most
``max_concurrency`` of them at once (its log line "Maximum concurrency for N tokens per request: X x").

Formula (per GPU; see docs/sizing.md for the sources)
-----------------------------------------------------
budget   = memory.total x gpu_memory_utilization
weights  = weight bytes / (tp x pp)         (exact from the files; else parameter count x dtype/quant bits)
kv/token = 2 x ceil(kv_layers / pp) x max(1, kv_heads // tp) x head_dim x kv-dtype bytes
           (MLA: ceil(layers / pp) x (kv_lora_rank + qk_rope_head_dim) x bytes, the same on every TP rank)
overhead = RUNTIME (0.5 GiB) + CUDA graphs (0.5 GiB, 0 with enforce_eager)
           + max_num_batched_tokens x hidden_size x 32 B + max_num_seqs x vocab_size x 8 B
fits     <=> budget - weights - overhead >= ceil(max_model_len / block_size) blocks of KV

All functions here are pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from vllm_fleet.core.modelinfo import ModelInfo, dtype_bytes

GiB = 1 << 30
MiB = 1 << 20

# --- constants (why each value: docs/sizing.md, "Constants") --------------------------------------------
# Memory vLLM's profiler counts outside PyTorch's activations: NCCL and custom all-reduce buffers,
# cuBLAS/cuDNN workspaces, torch.compile artifacts, allocator fragmentation. Typical logs show 0.1-0.4 GiB.
RUNTIME_BYTES = GiB // 2
# CUDA graphs for the default capture sizes (up to 512 sequences): 0.3-1 GiB in vLLM's "Graph capturing
# finished ... took X GiB" line for 7B-70B models. Newer vLLM estimates this at profiling and subtracts it
# from the KV budget; older versions allocate it after the KV cache. Either way it has to fit.
CUDA_GRAPH_BYTES = GiB // 2
# Peak activations of the profiling pass, per batched token and per unit of hidden size: residual +
# normed input + QKV + attention output (~5 x hidden) and the gated MLP's gate/up/act (~3 x 3.5 x hidden)
# in 16-bit is ~30 B; 32 B rounds up. Not divided by TP (the residual stream is replicated on each rank).
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 32
# The profiler's dummy sampler pass: float32 logits for max_num_seqs rows plus the copy top-p/top-k makes.
SAMPLER_BYTES_PER_SEQ_VOCAB = 8
DEFAULT_BLOCK_SIZE = 16  # vLLM's CUDA default
CPU_BLOCK_SIZE = 128  # vLLM's CPU backend default
# vLLM's defaults for `vllm serve` (usage context OPENAI_API_SERVER) when --max-num-batched-tokens is unset:
# EngineArgs.get_batch_defaults, the same in 0.31-0.34 but for GB10 (below). The one definition: the
# memory estimate here and the start-up checks (core/startup.py) both read it.
HUGE_GPU_BATCHED_TOKENS = 16384  # GPUs with >= 160 GiB (B200, B300)
BIG_GPU_BATCHED_TOKENS = 8192  # GPUs with >= 70 GiB, except A100 and (from 0.33) GB10
SMALL_GPU_BATCHED_TOKENS = 2048
CPU_BATCHED_TOKENS_PER_RANK = 2048  # the CPU build: per rank of tensor x pipeline parallelism
HUGE_GPU_MIB = 160 * 1024
BIG_GPU_MIB = 70 * 1024
# Ways out: the highest utilization suggested (leave room for the CUDA context and other processes) and
# the step max_model_len suggestions are rounded down to.
MAX_SUGGESTED_UTILIZATION = 0.95
MODEL_LEN_STEP = 256
DEFAULT_MAX_TP = 8

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
           "fp16": "float16", "float32": "float32", "float": "float32", "fp32": "float32"}


def _gib(n: float) -> float:
    return n / GiB


def resolve_dtype(dtype: str | None, info: ModelInfo) -> str:
    """The dtype vLLM computes in: ``auto`` is the config's torch_dtype, except that float32 (or none
    given) becomes bfloat16, as vLLM does on platforms that support it (GPUs from sm80, x86 CPUs)."""
    if dtype not in (None, "auto"):
        try:
            return _DTYPES[str(dtype).lower()]
        except KeyError:
            raise ValueError(f"dtype {dtype!r}: expected auto, bfloat16, float16 or float32") from None
    config = _DTYPES.get(str(info.torch_dtype).lower().removeprefix("torch."))
    return "bfloat16" if config in (None, "float32") else config


def kv_element_bytes(kv_cache_dtype: str | None, model_dtype: str) -> int:
    """Bytes per cached K/V value: ``auto`` stores the model dtype; every fp8 variant stores one byte."""
    if kv_cache_dtype in (None, "auto"):
        return dtype_bytes(model_dtype) or 2
    if str(kv_cache_dtype).startswith("fp8"):
        return 1
    size = dtype_bytes(kv_cache_dtype)
    if size is None:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: expected auto or an fp8 variant")
    return size


def kv_bytes_per_token(info: ModelInfo, *, tp: int = 1, pp: int = 1, element_bytes: int = 2) -> int:
    """KV cache bytes one token takes on one GPU (the GPU of the largest pipeline stage).

    K and V (the 2), for every attention layer of the stage, for the KV heads of this rank: vLLM gives
    each rank ``max(1, kv_heads // tp)`` heads, replicating them when tp exceeds the KV head count. MLA
    caches one latent of ``kv_lora_rank + qk_rope_head_dim`` values per layer, whole on every rank.
    """
    layers = math.ceil(info.num_kv_layers / pp)
    if info.use_mla:
        return layers * ((info.kv_lora_rank or 0) + (info.qk_rope_head_dim or 0)) * element_bytes
    return 2 * layers * max(1, info.num_kv_heads // tp) * info.head_dim * element_bytes


def model_weight_bytes(info: ModelInfo, dtype: str) -> tuple[int, bool]:
    """(bytes of all weights once loaded, exact?): file sizes when known, else from the parameter count.

    Unquantized weights are cast to the serving dtype, so a float32 checkpoint served in bfloat16 takes
    half its file size. Estimated quantized weights: linear layers at the quantization's bits, the
    embeddings and LM head in the serving dtype (weight-only quantizers leave them alone).
    """
    el = dtype_bytes(dtype) or 2
    if info.weight_bytes is not None:
        stored = dtype_bytes(info.torch_dtype)
        if info.quantization is None and stored and stored != el:
            return info.weight_bytes * el // stored, True
        return info.weight_bytes, True
    params, embed = info.param_count(), info.embedding_params()
    if info.quant_bits:
        return math.ceil((params - embed) * info.quant_bits / 8) + embed * el, False
    return params * el, False


def default_max_num_batched_tokens(gpu_memory_total_mib: int, gpu_name: str | None = None,
                                   compute_capability: tuple[int, int] | None = None,
                                   gb10_small: bool = True) -> int:
    """What `vllm serve` uses on a GPU when --max-num-batched-tokens is unset (vLLM's EngineArgs
    defaults). vLLM says why A100 stays small: a larger budget lowered its throughput (vLLM PR #17885);
    GB10 (DGX Spark, 12.1) has the memory but not the compute of a large GPU. `gb10_small`: the release
    has that rule (0.33 and later)."""
    if gpu_memory_total_mib >= HUGE_GPU_MIB:
        return HUGE_GPU_BATCHED_TOKENS
    gb10 = gb10_small and compute_capability == (12, 1)
    big = gpu_memory_total_mib >= BIG_GPU_MIB and "a100" not in (gpu_name or "").lower() and not gb10
    return BIG_GPU_BATCHED_TOKENS if big else SMALL_GPU_BATCHED_TOKENS


def valid_tp(info: ModelInfo, tp: int) -> bool:
    """vLLM's own rule: attention heads split evenly, and KV heads split or replicate evenly."""
    if tp < 1 or info.num_attention_heads % tp:
        return False
    return info.use_mla or info.num_kv_heads % tp == 0 or tp % info.num_kv_heads == 0


@dataclass(frozen=True)
class Settings:
    """The vLLM settings and GPU one estimate is for; ways out are copies with one field changed."""

    tp: int
    pp: int
    max_model_len: int
    max_num_seqs: int
    kv_cache_dtype: str
    dtype: str
    gpu_memory_total_mib: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    enforce_eager: bool = False
    gpu_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    gb10_small: bool = True  # the release keeps GB10 on the small batch tier (0.33 and later)

    def batched_tokens(self) -> int:
        """Tokens in the profiling pass: the flag, else vLLM's default; with chunked prefill off vLLM
        must fit a whole prompt in one step, so it is at least max_model_len."""
        tokens = self.max_num_batched_tokens or default_max_num_batched_tokens(
            self.gpu_memory_total_mib, self.gpu_name, self.compute_capability, self.gb10_small)
        if self.enable_chunked_prefill is False and self.max_num_batched_tokens is None:
            tokens = max(tokens, self.max_model_len)
        return tokens


@dataclass(frozen=True)
class WayOut:
    """One setting change that makes the estimate fit, already re-estimated with it."""

    flag: str
    value: int | float | str  # the flag's new value
    settings: Settings
    note: str = ""  # why the value stops where it does ("the model's limit")

    def __str__(self) -> str:
        if self.flag == "max_model_len":
            return f"max_model_len <= {self.value}" + (f" ({self.note})" if self.note else "")
        if self.flag == "gpu_memory_utilization":
            return f"gpu_memory_utilization {self.value:.2f}"
        return f"{self.flag} {self.value}"


@dataclass(frozen=True)
class Estimate:
    """Per-GPU memory of one vLLM instance, in GiB, and whether vLLM will start (``fits``).

    ``max_concurrency`` is vLLM's "Maximum concurrency for max_model_len tokens per request" (full-length
    sequences the KV cache holds at once); ``concurrency`` is what it will reach, capped by max_num_seqs.
    ``max_tp`` is the tensor-parallel size the instance's GPUs allow (per pipeline stage); ``more_gpus``,
    set only when no TP up to it fits, is the smallest TP beyond it that would, i.e. more GPUs than the
    instance has.
    """

    settings: Settings
    architecture: str
    dtype: str
    budget_gib: float
    gpu_memory_total_gib: float
    weights_gib: float
    weights_exact: bool
    overhead_gib: float
    kv_bytes_per_token: int
    kv_one_seq_gib: float
    kv_all_seqs_gib: float
    kv_available_gib: float
    kv_capacity_tokens: int
    max_concurrency: float
    concurrency: int
    needed_gib: float
    fits: bool
    ways_out: tuple[WayOut, ...] = field(default=())
    max_tp: int = DEFAULT_MAX_TP
    more_gpus: WayOut | None = None

    @property
    def all_seqs_fit(self) -> bool:
        """True when max_num_seqs full-length sequences fit at once (else vLLM queues the excess)."""
        return self.concurrency >= self.settings.max_num_seqs

    def _gpu(self) -> str:
        s = self.settings
        parts = [f"{self.gpu_memory_total_gib:.1f} GiB" + (f" {s.gpu_name}" if s.gpu_name else "")]
        if s.tp > 1:
            parts.append(f"tensor_parallel_size {s.tp}")
        if s.pp > 1:
            parts.append(f"pipeline_parallel_size {s.pp}")
        return ", ".join(parts)

    def _breakdown(self) -> str:
        return (f"weights {self.weights_gib:.1f} GiB + KV for one {self.settings.max_model_len}-token "
                f"sequence {self.kv_one_seq_gib:.1f} GiB + overhead {self.overhead_gib:.1f} GiB")

    def _more_gpus(self, host_gpus: int | None) -> str:
        """The TP way out that needs more GPUs than the instance has, said as such (never as a bare
        tensor_parallel_size, which the planner would refuse for this instance)."""
        assert self.more_gpus is not None
        w = self.more_gpus.settings
        need, have = w.tp * w.pp, self.max_tp * w.pp
        layout = f"tensor_parallel_size {w.tp}" + (f" x pipeline_parallel_size {w.pp}" if w.pp > 1 else "")
        text = f"more GPUs than this instance has ({have}): {layout} over {need} GPUs"
        if host_gpus is None:
            return f"{text} of {self.gpu_memory_total_gib:.1f} GiB"
        if host_gpus >= need:
            return f"{text} (gpus: {need}; this host has {host_gpus})"
        return (f"{text}, so a host with {need} GPUs of {self.gpu_memory_total_gib:.1f} GiB "
                f"(this one has {host_gpus})")

    def refusal(self, host: str, instance: str, *, host_gpus: int | None = None) -> str:
        """The operator's message for an instance vLLM would refuse to start, with the ways out.

        ``host_gpus``: the GPUs the host could give an instance, to say whether a TP that needs more
        GPUs than the instance has is still possible here."""
        if self.fits:
            raise ValueError(f"{host}: vllm.instances[{instance}] fits; there is nothing to refuse")
        head = (f"{host}: vllm.instances[{instance}]: needs {self.needed_gib:.1f} GiB per GPU, has "
                f"{self.budget_gib:.1f} GiB at {self.settings.gpu_memory_utilization:.2f} ({self._gpu()}): "
                f"{self._breakdown()}")
        ways = [str(w) for w in self.ways_out]
        if self.more_gpus is not None:
            ways.append(self._more_gpus(host_gpus))
        if ways:
            return f"{head}; ways out: " + ", or ".join(ways)
        return f"{head}; no single setting change fits: use GPUs with more memory"

    def summary(self, host: str, instance: str) -> str:
        """One line for a plan: what fits, and the concurrency vLLM will reach."""
        s = self.settings
        if not self.fits:
            return self.refusal(host, instance)
        limit = ("" if self.all_seqs_fit else
                 f"; KV holds {self.max_concurrency:.2f} full-length sequences, so at most "
                 f"{self.concurrency} of max_num_seqs {s.max_num_seqs} run at once")
        return (f"{host}: vllm.instances[{instance}]: fits: {self.needed_gib:.1f} of {self.budget_gib:.1f} "
                f"GiB per GPU at {s.gpu_memory_utilization:.2f} ({self._gpu()}): {self._breakdown()}; "
                f"KV cache {self.kv_capacity_tokens:,} tokens{limit}")


class _Parts(NamedTuple):
    """The byte counts of one estimate, before they become GiB for people."""

    dtype: str
    total: int
    budget: int
    weights: int
    exact: bool
    overhead: int
    per_token: int
    page: int
    blocks_per_seq: int

    @property
    def available(self) -> int:
        return self.budget - self.weights - self.overhead

    @property
    def needed(self) -> int:
        return self.weights + self.overhead + self.blocks_per_seq * self.page


def _parts(info: ModelInfo, s: Settings) -> _Parts:
    if s.tp < 1 or s.pp < 1:
        raise ValueError(f"tensor_parallel_size {s.tp} and pipeline_parallel_size {s.pp} must be >= 1")
    if not valid_tp(info, s.tp):
        raise ValueError(f"tensor_parallel_size {s.tp} does not split {info.num_attention_heads} attention "
                         f"heads / {info.num_kv_heads} KV heads evenly; vLLM refuses it")
    if s.max_model_len < 1 or s.max_num_seqs < 1 or s.block_size < 1 or s.gpu_memory_total_mib < 1:
        raise ValueError("max_model_len, max_num_seqs, block_size and gpu_memory_total_mib must be >= 1")
    if not 0 < s.gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization {s.gpu_memory_utilization} is not in (0, 1]")
    dtype = resolve_dtype(s.dtype, info)
    total = s.gpu_memory_total_mib * MiB
    weights_all, exact = model_weight_bytes(info, dtype)
    per_token = kv_bytes_per_token(info, tp=s.tp, pp=s.pp,
                                   element_bytes=kv_element_bytes(s.kv_cache_dtype, dtype))
    overhead = (RUNTIME_BYTES + (0 if s.enforce_eager else CUDA_GRAPH_BYTES)
                + s.batched_tokens() * info.hidden_size * ACTIVATION_BYTES_PER_TOKEN_HIDDEN
                + s.max_num_seqs * info.vocab_size * SAMPLER_BYTES_PER_SEQ_VOCAB)
    return _Parts(
        dtype=dtype, total=total, budget=math.floor(total * s.gpu_memory_utilization),
        weights=math.ceil(weights_all / (s.tp * s.pp)), exact=exact, overhead=overhead,
        per_token=per_token, page=s.block_size * per_token,
        blocks_per_seq=math.ceil(s.max_model_len / s.block_size),
    )


def _core(info: ModelInfo, s: Settings) -> Estimate:
    """The estimate without ways out (ways out are themselves checked with it)."""
    p = _parts(info, s)
    blocks = max(0, p.available // p.page)
    max_conc = blocks / p.blocks_per_seq
    kv_one = p.blocks_per_seq * p.page
    return Estimate(
        settings=s,
        architecture=info.architecture,
        dtype=p.dtype,
        budget_gib=_gib(p.budget),
        gpu_memory_total_gib=_gib(p.total),
        weights_gib=_gib(p.weights),
        weights_exact=p.exact,
        overhead_gib=_gib(p.overhead),
        kv_bytes_per_token=p.per_token,
        kv_one_seq_gib=_gib(kv_one),
        kv_all_seqs_gib=_gib(kv_one * s.max_num_seqs),
        kv_available_gib=_gib(p.available),
        kv_capacity_tokens=blocks * s.block_size,
        max_concurrency=max_conc,
        concurrency=min(s.max_num_seqs, math.floor(max_conc)),
        needed_gib=_gib(p.needed),
        fits=blocks >= p.blocks_per_seq,
    )


def _tp_fits(info: ModelInfo, s: Settings, tps: Iterable[int], multiple: int) -> WayOut | None:
    """The first TP of ``tps`` that vLLM accepts for the model (the planner's rule) and that fits."""
    for tp in tps:
        if tp % multiple == 0 and valid_tp(info, tp) and _core(info, replace(s, tp=tp)).fits:
            return WayOut("tensor_parallel_size", tp, replace(s, tp=tp))
    return None


def _ways_out(info: ModelInfo, s: Settings, max_tp: int,
              tp_multiple: int = 1) -> tuple[tuple[WayOut, ...], WayOut | None]:
    """Single changes that fit, each verified by re-estimating: shorter context, more TP, fp8 KV, higher
    utilization. Combinations are left to the operator; one change is easier to review.

    Only what this instance can do is a way out: TP up to ``max_tp`` (its GPUs), a context within the
    model's limit. The second value is the smallest TP beyond ``max_tp`` that fits, when none up to it
    does: said as "more GPUs", since the planner refuses a TP larger than the instance's GPUs.
    """
    p, ways = _parts(info, s), []
    length = (max(0, p.available) // p.page * s.block_size) // MODEL_LEN_STEP * MODEL_LEN_STEP
    limit, note = info.context_limit, ""
    if limit is not None and length > limit:
        length, note = limit, "the model's limit"
    # Overhead only shrinks with length, so the first try fits unless chunked prefill is off.
    for _ in range(64):
        if length < MODEL_LEN_STEP or length >= s.max_model_len:
            break
        if _core(info, replace(s, max_model_len=length)).fits:
            ways.append(WayOut("max_model_len", length, replace(s, max_model_len=length), note))
            break
        length, note = (length - 1) // MODEL_LEN_STEP * MODEL_LEN_STEP, ""
    more_gpus = None
    tp_way = _tp_fits(info, s, range(s.tp + 1, max_tp + 1), tp_multiple)
    if tp_way is not None:
        ways.append(tp_way)
    else:
        # TP cannot exceed the attention heads (each rank needs whole heads).
        more_gpus = _tp_fits(info, s, range(max(s.tp, max_tp) + 1, info.num_attention_heads + 1),
                             tp_multiple)
    if kv_element_bytes(s.kv_cache_dtype, p.dtype) > 1 and _core(info, replace(s, kv_cache_dtype="fp8")).fits:
        ways.append(WayOut("kv_cache_dtype", "fp8", replace(s, kv_cache_dtype="fp8")))
    util = math.ceil(p.needed / p.total * 100 - 1e-9) / 100
    for u in (util, util + 0.01):  # the second guards the floor() of the budget
        u = round(u, 2)
        if s.gpu_memory_utilization < u <= MAX_SUGGESTED_UTILIZATION and _core(
                info, replace(s, gpu_memory_utilization=u)).fits:
            ways.append(WayOut("gpu_memory_utilization", u, replace(s, gpu_memory_utilization=u)))
            break
    return tuple(ways), more_gpus


def estimate_settings(info: ModelInfo, settings: Settings, *, max_tp: int = DEFAULT_MAX_TP,
                      tp_multiple: int = 1) -> Estimate:
    """``estimate`` for a ready Settings (e.g. a WayOut's), with ways out when it does not fit."""
    est = replace(_core(info, settings), max_tp=max_tp)
    if est.fits:
        return est
    ways, more_gpus = _ways_out(info, settings, max_tp, tp_multiple)
    return replace(est, ways_out=ways, more_gpus=more_gpus)


def estimate(
    info: ModelInfo,
    *,
    tp: int = 1,
    pp: int = 1,
    max_model_len: int | None = None,
    max_num_seqs: int = 256,
    kv_cache_dtype: str | None = "auto",
    dtype: str | None = "auto",
    gpu_memory_total_mib: int,
    gpu_memory_utilization: float = 0.90,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool | None = None,
    block_size: int | None = None,
    enforce_eager: bool = False,
    gpu_name: str | None = None,
    compute_capability: tuple[int, int] | None = None,
    gb10_small: bool = True,
    max_tp: int = DEFAULT_MAX_TP,
    tp_multiple: int = 1,
) -> Estimate:
    """Per-GPU memory of one vLLM instance against ``gpu_memory_total_mib x gpu_memory_utilization``.

    ``gpu_memory_total_mib`` is nvidia-smi's memory.total of one GPU (all GPUs of an instance are alike).
    ``max_model_len`` None means the length vLLM derives from config.json (max_position_embeddings, RoPE
    scaling applied). ``max_tp`` bounds the tensor_parallel_size ways out: the GPUs the instance has per
    pipeline stage; ``tp_multiple`` is what a TP must be a multiple of (the nodes of a tensor-split cluster).
    """
    if max_model_len is None:
        if info.default_max_model_len is None:
            raise ValueError("max_model_len is not set and config.json has no max_position_embeddings")
        max_model_len = info.default_max_model_len
    settings = Settings(
        tp=tp, pp=pp, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        kv_cache_dtype=kv_cache_dtype or "auto", dtype=dtype or "auto",
        gpu_memory_total_mib=gpu_memory_total_mib, gpu_memory_utilization=gpu_memory_utilization,
        max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
        block_size=block_size or DEFAULT_BLOCK_SIZE, enforce_eager=enforce_eager, gpu_name=gpu_name,
        compute_capability=compute_capability, gb10_small=gb10_small,
    )
    return estimate_settings(info, settings, max_tp=max_tp, tp_multiple=tp_multiple)


# --- CPU hosts ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuEstimate:
    """The KV cache of a CPU host: exactly ``VLLM_CPU_KVCACHE_SPACE`` GiB of RAM, whatever the model.

    The CPU backend does not profile: the KV cache is the env var's size, so the capacity is exact.
    """

    max_model_len: int
    max_num_seqs: int
    kvcache_gib: float
    dtype: str
    block_size: int
    kv_bytes_per_token: int
    kv_one_seq_gib: float
    kv_capacity_tokens: int
    max_concurrency: float
    concurrency: int
    fits: bool
    min_kvcache_gib: int  # the smallest whole VLLM_CPU_KVCACHE_SPACE that holds one sequence
    max_fitting_model_len: int  # the longest context (whole blocks) this space holds
    context_limit: int | None = None  # the model's own limit, which a suggested length never exceeds

    def vllm_log_lines(self) -> tuple[str, str]:
        """The two lines vLLM logs at startup for these numbers, to compare with a host's journal."""
        return (f"CPU KV cache size: {self.kv_capacity_tokens:,} tokens",
                f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
                f"{self.max_concurrency:.2f}x")

    def refusal(self, host: str, instance: str) -> str:
        if self.fits:
            raise ValueError(f"{host}: vllm.instances[{instance}] fits; there is nothing to refuse")
        ways = [f"VLLM_CPU_KVCACHE_SPACE={self.min_kvcache_gib}"]
        if self.context_limit is not None and self.max_fitting_model_len > self.context_limit:
            ways.append(f"max_model_len <= {self.context_limit} (the model's limit)")
        elif self.max_fitting_model_len >= self.block_size:
            ways.append(f"max_model_len <= {self.max_fitting_model_len}")
        return (f"{host}: vllm.instances[{instance}]: one {self.max_model_len}-token sequence needs "
                f"{self.kv_one_seq_gib:.2f} GiB of KV cache, VLLM_CPU_KVCACHE_SPACE gives "
                f"{self.kvcache_gib:g} GiB ({self.kv_capacity_tokens:,} tokens); ways out: "
                + ", or ".join(ways))


def estimate_cpu(
    info: ModelInfo,
    max_model_len: int,
    max_num_seqs: int,
    kvcache_gib: float,
    dtype: str | None = "auto",
    *,
    kv_cache_dtype: str | None = "auto",
    block_size: int = CPU_BLOCK_SIZE,
    tp: int = 1,
) -> CpuEstimate:
    """KV capacity of ``VLLM_CPU_KVCACHE_SPACE=kvcache_gib``: whole blocks of ``block_size`` tokens.

    tokens = floor(kvcache_gib x 2^30 / (block_size x bytes per token)) x block_size, which is what vLLM
    logs as its KV cache size; each TP rank gets its own space.
    """
    if kvcache_gib <= 0 or max_model_len < 1 or max_num_seqs < 1 or block_size < 1:
        raise ValueError("kvcache_gib, max_model_len, max_num_seqs and block_size must be positive")
    resolved = resolve_dtype(dtype, info)
    per_token = kv_bytes_per_token(info, tp=tp, element_bytes=kv_element_bytes(kv_cache_dtype, resolved))
    page = block_size * per_token
    blocks = math.floor(kvcache_gib * GiB) // page
    blocks_per_seq = math.ceil(max_model_len / block_size)
    max_conc = blocks / blocks_per_seq
    one_seq = blocks_per_seq * page
    return CpuEstimate(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        kvcache_gib=kvcache_gib,
        dtype=resolved,
        block_size=block_size,
        kv_bytes_per_token=per_token,
        kv_one_seq_gib=_gib(one_seq),
        kv_capacity_tokens=blocks * block_size,
        max_concurrency=max_conc,
        concurrency=min(max_num_seqs, math.floor(max_conc)),
        fits=blocks >= blocks_per_seq,
        min_kvcache_gib=max(1, math.ceil(one_seq / GiB)),
        max_fitting_model_len=blocks * block_size,
        context_limit=info.context_limit,
    )


# --- docs ---------------------------------------------------------------------------------------------
def fleet_table(models: Iterable[tuple[str, ModelInfo]], **settings: Any) -> str:
    """The docs/sizing.md comparison: each model at the same settings, TP raised until it fits (or not).

    Pure, so a test can check that the table pasted in the docs is still what the code computes.
    """
    rows: list[Sequence[str]] = [(
        "model", "TP", "weights/GPU", "KV B/token/GPU", "KV 1 seq", "KV all seqs", "overhead", "needed",
        "budget", "fits", "KV tokens", "max conc.", "reached")]
    for name, info in models:
        est = estimate(info, **settings)
        if not est.fits:
            tps = [w for w in est.ways_out if w.flag == "tensor_parallel_size"]
            if tps:
                est = estimate_settings(info, tps[0].settings)
        rows.append((
            name, str(est.settings.tp), f"{est.weights_gib:.2f}", f"{est.kv_bytes_per_token:,}",
            f"{est.kv_one_seq_gib:.2f}", f"{est.kv_all_seqs_gib:.2f}", f"{est.overhead_gib:.2f}",
            f"{est.needed_gib:.2f}", f"{est.budget_gib:.2f}", "yes" if est.fits else "no",
            f"{est.kv_capacity_tokens:,}", f"{est.max_concurrency:.2f}x", str(est.concurrency)))
    head, *body = rows
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)
