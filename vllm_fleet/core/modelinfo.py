"""What a model is, for sizing: read from its config.json and its weight files' headers, on the controller.

Why this exists
---------------
The memory preflight (``vllm_fleet.core.sizing``) must predict an out-of-memory refusal before any host is
touched,
so it needs the few numbers that decide vLLM's memory use: layers, KV heads, head size, dtype, the
quantization method and the exact size of the weights. All of them are in two small places: config.json,
and the JSON header at the front of every ``*.safetensors`` file. Reading them costs kilobytes even for a
140 GB checkpoint, because a safetensors file starts with an 8-byte little-endian header length and a JSON
header that gives every tensor's byte range; the tensor data after it is never read.

Pure core, thin I/O
-------------------
``from_config`` (a dict), ``safetensors_header_bytes`` (header bytes) and ``index_total_size`` (a dict)
are pure, so they are tested on literal inputs; ``weight_bytes_from_dir`` and ``load`` only open files.

Config families handled (their config.json spellings differ):

* Llama, Mistral, Qwen2/2.5, Qwen3: ``num_key_value_heads`` for GQA; ``head_dim`` explicit (Qwen3,
  Mistral-Nemo: 5120 hidden / 32 heads but head_dim 128) or ``hidden_size / num_attention_heads``.
* Mixtral / gpt-oss ``num_local_experts``, Qwen-MoE ``num_experts``, DeepSeek ``n_routed_experts``.
* DeepSeek-V2/V3 MLA (``kv_lora_rank``): vLLM caches one compressed latent per token and layer
  (``kv_lora_rank + qk_rope_head_dim`` values), not K and V per head.
* Gemma: explicit ``head_dim`` (256 where hidden/heads would give 192 or 320).
* Multimodal wrappers (Gemma 3, Llava, Mistral 3, Qwen-VL): the language model's numbers sit in a
  nested ``text_config``; keys missing there fall back to the top level.
* ``layer_types`` (Qwen3-Next/3.5 hybrids): ``linear_attention`` layers keep a fixed-size state, so only
  the attention layers count toward KV cache that grows with tokens.
* Qwen2 writes ``sliding_window`` even when ``use_sliding_window`` is false; it is reported only when
  it is in force.
* Context length: ``max_position_embeddings`` and its other spellings, with RoPE scaling applied the way
  vLLM derives its limit (``rope_scaling``, or transformers v5's ``rope_parameters``): YaRN is
  ``original_max_position_embeddings x factor``, linear/dynamic multiply by ``factor``, while ``llama3``
  and LongRoPE configs already state the extended length (and Gemma 3's is already scaled).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

# Bytes per element for the dtype spellings of config.json, vLLM's --dtype and safetensors headers.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float": 4, "fp32": 4, "f32": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "half": 2, "fp16": 2, "f16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "f8_e4m3": 1, "f8_e5m2": 1,
    "int8": 1, "uint8": 1, "i8": 1, "u8": 1,
}
# The safetensors spec caps the JSON header at 100 MB; a bigger length means a corrupt or foreign file.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
INDEX_FILE = "model.safetensors.index.json"


class ModelInfoError(ValueError):
    """A config.json or weight file that cannot describe a model: the message says which key or file."""


@dataclass(frozen=True)
class ModelInfo:
    """The numbers of one model that decide how much memory vLLM needs to serve it.

    ``weight_bytes`` is the on-disk size of the weights (None when no weight files or index were
    readable); ``vllm_fleet.core.sizing`` then falls back to ``param_count()``. ``kv_layers`` is the number of
    layers whose KV cache grows with the sequence (all of them except in hybrid linear-attention models).
    """

    architecture: str
    model_type: str | None
    num_layers: int
    hidden_size: int
    intermediate_size: int | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    torch_dtype: str | None
    quantization: str | None = None
    quant_bits: int | None = None
    weight_bytes: int | None = None
    is_moe: bool = False
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    num_dense_layers: int = 0
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    kv_layers: int | None = None
    # MLA (DeepSeek-V2/V3): compressed KV cache of kv_lora_rank + qk_rope_head_dim values per token/layer.
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    # vLLM's derived context: the longest max_model_len it starts with (longer needs
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), and what it uses when the flag is unset (shorter for LongRoPE).
    max_model_len_limit: int | None = None
    max_model_len_default: int | None = None

    @property
    def context_limit(self) -> int | None:
        """The longest max_model_len vLLM accepts for this model; None when config.json does not say."""
        return self.max_model_len_limit or self.max_position_embeddings

    @property
    def default_max_model_len(self) -> int | None:
        """The max_model_len vLLM serves with when the flag is unset."""
        return self.max_model_len_default or self.context_limit

    @property
    def use_mla(self) -> bool:
        """True for DeepSeek-style multi-head latent attention, whose KV cache has no per-head K and V."""
        return self.kv_lora_rank is not None

    @property
    def num_kv_layers(self) -> int:
        return self.num_layers if self.kv_layers is None else self.kv_layers

    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied): kept in 16-bit by weight-only quantizers."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def param_count(self) -> int:
        """Parameters of the language model, counted from the config (for when weight sizes are unknown).

        Gated MLPs (three matrices) are assumed, which holds for every family above; it reproduces the
        published totals of the fixtures in tests/fixtures/model_configs exactly. Vision towers of
        multimodal models are not counted (read the weight files for those).
        """
        h = self.hidden_size
        if self.use_mla:
            heads = self.num_attention_heads
            nope, rope = self.qk_nope_head_dim or 0, self.qk_rope_head_dim or 0
            v_dim = self.v_head_dim or nope
            kv_rank = self.kv_lora_rank or 0
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * (nope + rope)
            else:
                q = h * heads * (nope + rope)
            attn = q + h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim) + heads * v_dim * h
        else:
            q_out = self.num_attention_heads * self.head_dim
            kv_out = self.num_kv_heads * self.head_dim
            attn = h * q_out + 2 * h * kv_out + q_out * h
            if self.attention_bias:
                attn += q_out + 2 * kv_out
            if self.qk_norm:
                attn += 2 * self.head_dim
        dense_mlp = 3 * h * (self.intermediate_size or 4 * h)
        if self.is_moe and self.num_experts:
            expert_inter = self.moe_intermediate_size or self.intermediate_size or 4 * h
            moe_mlp = self.num_experts * 3 * h * expert_inter + h * self.num_experts  # experts + router
            if self.shared_expert_intermediate_size:
                moe_mlp += 3 * h * self.shared_expert_intermediate_size
            dense_layers = self.num_dense_layers
        else:
            moe_mlp, dense_layers = dense_mlp, self.num_layers
        norms = 2 * h
        layers = dense_layers * (attn + dense_mlp + norms) + (self.num_layers - dense_layers) * (
            attn + moe_mlp + norms
        )
        return self.embedding_params() + layers + h  # + final norm


# --- config.json ---------------------------------------------------------------------------------------
def _first(cfg: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def _require_int(cfg: Mapping[str, Any], what: str, *keys: str) -> int:
    value = _first(cfg, *keys)
    if value is None:
        raise ModelInfoError(f"config.json has no {what} (looked for {', '.join(keys)})")
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value <= 0:
        raise ModelInfoError(f"config.json {what} is {value!r}, not a positive integer")
    return int(value)


def _opt_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    value = _first(cfg, *keys)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def quantization_of(qcfg: Mapping[str, Any] | None) -> tuple[str | None, int | None]:
    """(method, weight bits) from a ``quantization_config``; bits None where the method does not say.

    Covers the spellings vLLM reads: GPTQ/AWQ ``bits`` (old AWQ ``w_bit``), compressed-tensors
    ``config_groups.*.weights.num_bits``, bitsandbytes ``load_in_4bit/8bit``, fp8 (8) and mxfp4 (4),
    ModelOpt ``quant_algo``.
    """
    if not qcfg:
        return None, None
    method = qcfg.get("quant_method")
    method = str(method).lower() if method is not None else None
    bits = _opt_int(qcfg, "bits", "w_bit", "weight_bits", "num_bits")
    if bits is None and isinstance(qcfg.get("config_groups"), Mapping):
        for group in qcfg["config_groups"].values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and weights.get("num_bits"):
                bits = int(weights["num_bits"])
                break
    if bits is None and method == "bitsandbytes":
        bits = 4 if qcfg.get("load_in_4bit") else 8 if qcfg.get("load_in_8bit") else None
    if bits is None and method in {"fp8", "fbgemm_fp8", "ptpc_fp8"}:
        bits = 8
    if bits is None and method == "mxfp4":
        bits = 4
    if bits is None and method == "modelopt":
        algo = str(qcfg.get("quant_algo", "")).upper()
        bits = 8 if "FP8" in algo else 4 if "FP4" in algo else None
    return method, bits


def _kv_layers(cfg: Mapping[str, Any], num_layers: int) -> int | None:
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != num_layers:
        return None
    grows = [t for t in types if isinstance(t, str) and "attention" in t and "linear" not in t]
    return len(grows)


# The keys vLLM reads for the context length (ModelConfig's max-length derivation): the smallest wins,
# except model_max_length (Command-R, Cohere), which overrides them.
# vllm/config/model.py _get_and_verify_max_len: RoPE types whose max_position_embeddings already counts
# the scaling, so their factor is not applied again (YaRN included, since 0.31)
ROPE_ALREADY_SCALED = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
# vllm/transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
@dataclass(frozen=True)
class ContextLength:
    """vLLM's derived max_model_len: the limit a set value may not exceed, the key it came from, and
    what vLLM uses when the flag is unset (LongRoPE starts in its short mode)."""

    limit: int
    key: str
    default: int
    rope_factor: float = 1.0
    model_max_length: int | None = None
    yarn: bool = False  # YaRN's factor is not applied: vLLM takes max_position_embeddings as scaled


def _num(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's own config (vLLM's hf_text_config); the top level for text-only models."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping) and sub.get("num_attention_heads") is not None:
            return sub
    return config


def _rope_entries(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(rope, Mapping) or not rope:
        return []
    if all(isinstance(v, Mapping) or v is None for v in rope.values()):  # keyed by layer type
        return [v for v in rope.values() if isinstance(v, Mapping) and v]
    return [rope]


def _rope_type(entry: Mapping[str, Any]) -> str:
    kind = str(entry.get("rope_type", entry.get("type", "default")))
    return {"su": "longrope", "mrope": "default", "telechat3-yarn": "yarn"}.get(kind, kind)


def context_length(config: Mapping[str, Any], *,
                   disable_sliding_window: bool = False) -> ContextLength | None:
    """vLLM's derived max_model_len from config.json, or None when config.json names no length key.

    Mirrors ``_get_and_verify_max_len`` (vllm/config/model.py, 0.31.0-0.33.0): the smallest of the length
    keys (``model_max_length`` overrides them), capped by an in-force sliding window when
    ``--disable-sliding-window`` is set, times the RoPE factor unless the type already counts it or the
    model is a Gemma 3. None without a key, because transformers then fills in its per-family default.

    """
    cfg = text_config(config)
    found = [(cfg[k], k) for k in MAX_LEN_KEYS if _num(cfg.get(k))]
    if not found:
        return None
    derived, key = min(found)
    mml = cfg.get("model_max_length") if _num(cfg.get("model_max_length")) else None
    if mml is not None:
        derived, key = mml, "model_max_length"
    sliding = cfg.get("sliding_window")
    if (disable_sliding_window and _num(sliding) and cfg.get("use_sliding_window") is not False
            and sliding < derived):
        derived, key = sliding, "sliding_window"
    entries = _rope_entries(cfg)
    factor = 1.0
    if entries and "gemma3" not in str(cfg.get("model_type") or ""):
        for entry in entries:
            if _rope_type(entry) not in ROPE_ALREADY_SCALED:
                factor = entry.get("factor", factor)
        factor = float(factor) if _num(factor) else 1.0
    limit = int(derived * factor)
    default = limit
    original = cfg.get("original_max_position_embeddings")
    if any(_rope_type(e) == "longrope" for e in entries) and _num(original):
        default = int(original)
    yarn = any(_rope_type(e) in ("yarn", "deepseek_yarn") for e in entries)
    return ContextLength(limit, key, default, factor, int(mml) if mml else None, yarn)


def context_lengths(cfg: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(the longest max_model_len vLLM accepts, the one it uses when the flag is unset); (None, None)
    when no length key is there (vLLM then assumes 2048 and warns)."""
    found = context_length(cfg)
    return (found.limit, found.default) if found else (None, None)


def from_config(config: Mapping[str, Any], weight_bytes: int | None = None) -> ModelInfo:
    """A ModelInfo from a parsed config.json; raises ModelInfoError naming the key that is missing or bad.

    For multimodal configs the language model's ``text_config`` wins over top-level keys, because the
    top level of e.g. Gemma 3 holds the wrapper (and sometimes the vision tower's sizes under other keys).
    """
    if not isinstance(config, Mapping):
        raise ModelInfoError("config.json is not a JSON object")
    text = config.get("text_config") or config.get("language_config") or config.get("llm_config")
    cfg: dict[str, Any] = {**config, **text} if isinstance(text, Mapping) else dict(config)

    architectures = config.get("architectures") or cfg.get("architectures") or []
    architecture = str(architectures[0]) if architectures else str(cfg.get("model_type") or "unknown")
    num_layers = _require_int(cfg, "layer count", "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _require_int(cfg, "hidden size", "hidden_size", "n_embd", "d_model", "dim")
    heads = _require_int(cfg, "attention head count", "num_attention_heads", "n_head", "n_heads")
    kv_heads = _opt_int(cfg, "num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
    kv_heads = kv_heads or heads  # no key at all means plain multi-head attention
    head_dim = _opt_int(cfg, "head_dim", "head_size")
    if head_dim is None:
        if hidden % heads:
            raise ModelInfoError(f"config.json has no head_dim and hidden_size {hidden} is not a multiple "
                                 f"of num_attention_heads {heads}")
        head_dim = hidden // heads
    vocab = _require_int(cfg, "vocab size", "vocab_size", "padded_vocab_size")

    num_experts = _opt_int(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    is_moe = bool(num_experts and num_experts > 1)
    num_dense = 0
    if is_moe:
        if cfg.get("first_k_dense_replace"):
            num_dense = int(cfg["first_k_dense_replace"])
        elif isinstance(cfg.get("mlp_only_layers"), list):
            num_dense = len(cfg["mlp_only_layers"])
    moe_inter = _opt_int(cfg, "moe_intermediate_size") if is_moe else None
    shared_inter = _opt_int(cfg, "shared_expert_intermediate_size") if is_moe else None
    n_shared = _opt_int(cfg, "n_shared_experts", "num_shared_experts")
    if is_moe and shared_inter is None and n_shared:
        shared_inter = n_shared * (moe_inter or _opt_int(cfg, "intermediate_size") or 4 * hidden)

    sliding = _opt_int(cfg, "sliding_window")
    if cfg.get("use_sliding_window") is False:
        sliding = None

    qcfg = config.get("quantization_config") or cfg.get("quantization_config") or config.get(
        "compression_config")
    method, bits = quantization_of(qcfg if isinstance(qcfg, Mapping) else None)
    dtype = _first(config, "torch_dtype", "dtype") or _first(cfg, "torch_dtype", "dtype")
    model_type = cfg.get("model_type") or config.get("model_type")
    kv_lora = _opt_int(cfg, "kv_lora_rank")
    limit, default_len = context_lengths(cfg)

    return ModelInfo(
        architecture=architecture,
        model_type=str(model_type) if model_type else None,
        num_layers=num_layers,
        hidden_size=hidden,
        intermediate_size=_opt_int(cfg, "intermediate_size", "ffn_dim", "n_inner"),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=_opt_int(cfg, "max_position_embeddings", "n_positions", "max_seq_len",
                                         "seq_length"),
        torch_dtype=str(dtype) if dtype else None,
        quantization=method,
        quant_bits=bits,
        weight_bytes=weight_bytes,
        is_moe=is_moe,
        num_experts=num_experts if is_moe else None,
        num_experts_per_tok=_opt_int(cfg, "num_experts_per_tok", "moe_topk") if is_moe else None,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        num_dense_layers=num_dense,
        sliding_window=sliding,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        kv_layers=_kv_layers(cfg, num_layers),
        kv_lora_rank=kv_lora,
        q_lora_rank=_opt_int(cfg, "q_lora_rank") if kv_lora else None,
        qk_nope_head_dim=_opt_int(cfg, "qk_nope_head_dim") if kv_lora else None,
        qk_rope_head_dim=_opt_int(cfg, "qk_rope_head_dim") if kv_lora else None,
        v_head_dim=_opt_int(cfg, "v_head_dim") if kv_lora else None,
        # Qwen2 (and Qwen2-MoE) always have q/k/v biases without saying so in config.json.
        attention_bias=bool(cfg.get("attention_bias") or cfg.get("qkv_bias")
                            or model_type in {"qwen2", "qwen2_moe"}),
        qk_norm=model_type in {"qwen3", "qwen3_moe"},
        max_model_len_limit=limit,
        max_model_len_default=default_len,
    )


# --- safetensors headers ---------------------------------------------------------------------------------
def safetensors_header_bytes(header: bytes) -> int:
    """Total tensor bytes described by one safetensors JSON header (the bytes after the 8-byte length).

    Each entry's ``data_offsets`` [begin, end) is its exact byte range, so the sum is the data size whatever
    the dtypes (quantized int32-packed weights, fp8 scales) without a dtype table.
    """
    try:
        meta = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelInfoError(f"safetensors header is not JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ModelInfoError("safetensors header is not a JSON object")
    total = 0
    for name, entry in meta.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ModelInfoError(f"safetensors header entry {name!r} has no valid data_offsets")
        total += offsets[1] - offsets[0]
    return total


def read_safetensors_header(path: Path) -> bytes:
    """The JSON header of one safetensors file: reads 8 + N bytes, never the tensor data."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ModelInfoError(f"{path}: shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_SAFETENSORS_HEADER:
            raise ModelInfoError(f"{path}: header length {length} exceeds the safetensors limit; not a "
                                 "safetensors file?")
        header = f.read(length)
    if len(header) != length:
        raise ModelInfoError(f"{path}: truncated safetensors header ({len(header)} of {length} bytes)")
    return header


def index_total_size(index: Mapping[str, Any]) -> int | None:
    """``metadata.total_size`` of a model.safetensors.index.json, or None when absent."""
    meta = index.get("metadata")
    size = meta.get("total_size") if isinstance(meta, Mapping) else None
    if isinstance(size, int | float) and not isinstance(size, bool) and size > 0:
        return int(size)
    return None


def weight_bytes_from_dir(path: str | Path) -> int | None:
    """Exact weight bytes of a model directory, or None when it holds no safetensors weights or index.

    Which files count is what vLLM loads: with an index, only the shards its ``weight_map`` names (Mistral
    repos also ship a duplicate ``consolidated.safetensors``); without one, every ``*.safetensors`` except
    ``consolidated*`` when HF-format files sit beside it. When the index names shards that are not here (a
    checkout with only config + index, an interrupted download), its ``total_size`` is used instead.
    """
    root = Path(path)
    index: dict[str, Any] | None = None
    index_path = root / INDEX_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelInfoError(f"{index_path}: {exc}") from exc
        if not isinstance(index, dict):
            raise ModelInfoError(f"{index_path}: not a JSON object")
    files = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    if index is not None:
        weight_map = index.get("weight_map")
        names = set(weight_map.values()) if isinstance(weight_map, Mapping) else set()
        if names and all((root / n).is_file() for n in names):
            files = sorted(root / n for n in names)
        else:
            total = index_total_size(index)
            if total is not None:
                return total
    elif any(not p.name.startswith("consolidated") for p in files):
        files = [p for p in files if not p.name.startswith("consolidated")]
    if not files:
        return None
    return sum(safetensors_header_bytes(read_safetensors_header(p)) for p in files)


def load(path: str | Path) -> ModelInfo:
    """ModelInfo of a model directory on the controller: its config.json plus its weight files' headers."""
    root = Path(path)
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError as exc:
        raise ModelInfoError(f"{root}: no config.json (is this a Hugging Face model directory?)") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelInfoError(f"{config_path}: {exc}") from exc
    return from_config(config, weight_bytes_from_dir(root))


def dtype_bytes(name: str | None) -> int | None:
    """Bytes per element for a dtype name in any of the spellings above; None when unknown."""
    if name is None:
        return None
    return DTYPE_BYTES.get(str(name).lower().removeprefix("torch."))
