"""vllm_fleet.core.modelinfo: config.json families and safetensors headers, read without touching tensor
data."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from fleetlab import tinymodel
from vllm_fleet.core import modelinfo
from vllm_fleet.core.modelinfo import ModelInfoError, from_config, quantization_of, weight_bytes_from_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_fixtures_name_their_source_and_weight_size() -> None:
    files = sorted(FIXTURES.glob("*.json"))
    assert len(files) >= 5
    for path in files:
        cfg = json.loads(path.read_text())
        assert cfg["_source"].startswith("https://huggingface.co/"), path.name
        assert isinstance(cfg["_weight_bytes"], int) and cfg["_weight_bytes"] > 0, path.name


@pytest.mark.parametrize("name", [p.stem for p in sorted(FIXTURES.glob("*.json"))])
def test_param_count_reproduces_published_size(name: str) -> None:
    # The fixtures' _weight_bytes are the published index total_size (params x 2 bytes, bf16), so the
    # config-only fallback must land on them exactly. Llama-3.1-8B by hand: embed + lm_head
    # 2 x 128256 x 4096 = 1,050,673,152; per layer q,o 2 x 4096^2 = 33,554,432, k,v 2 x 4096 x 1024 =
    # 8,388,608, MLP 3 x 4096 x 14336 = 176,160,768, norms 8192 -> 218,112,000 x 32 = 6,979,584,000;
    # final norm 4096: 8,030,261,248 params x 2 = 16,060,522,496.
    cfg = fixture(name)
    assert from_config(cfg).param_count() * 2 == cfg["_weight_bytes"]


def test_llama_8b_fields() -> None:
    info = from_config(fixture("Llama-3.1-8B-Instruct"), 16060522496)
    assert (info.architecture, info.num_layers, info.hidden_size, info.num_attention_heads) == (
        "LlamaForCausalLM", 32, 4096, 32)
    assert (info.num_kv_heads, info.head_dim, info.vocab_size, info.max_position_embeddings) == (
        8, 128, 128256, 131072)
    assert (info.torch_dtype, info.quantization, info.is_moe, info.weight_bytes) == (
        "bfloat16", None, False, 16060522496)


def test_moe_spellings() -> None:
    mixtral = from_config(fixture("Mixtral-8x7B-Instruct-v0.1"))
    qwen3 = from_config(fixture("Qwen3-30B-A3B"))
    deepseek = from_config(fixture("DeepSeek-V2-Lite-Chat"))
    assert (mixtral.is_moe, mixtral.num_experts, mixtral.num_experts_per_tok) == (True, 8, 2)
    assert (qwen3.is_moe, qwen3.num_experts, qwen3.moe_intermediate_size) == (True, 128, 768)
    assert (deepseek.is_moe, deepseek.num_experts, deepseek.num_dense_layers) == (True, 64, 1)
    assert not from_config(fixture("Qwen2.5-7B-Instruct")).is_moe


def test_head_dim_explicit_beats_hidden_over_heads() -> None:
    # Qwen3-30B-A3B: hidden 2048 / 32 heads would be 64, but its head_dim is 128.
    assert from_config(fixture("Qwen3-30B-A3B")).head_dim == 128
    # Mistral-Nemo shape: 5120 / 32 = 160, published head_dim 128.
    nemo = {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 40, "hidden_size": 5120,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072}
    assert from_config(nemo).head_dim == 128
    # Llama: no head_dim key, 4096 / 32.
    assert from_config(fixture("Llama-3.1-8B-Instruct")).head_dim == 128


def test_mla_fields() -> None:
    info = from_config(fixture("DeepSeek-V2-Lite-Chat"))
    assert info.use_mla and (info.kv_lora_rank, info.qk_rope_head_dim, info.q_lora_rank) == (512, 64, None)
    assert not from_config(fixture("Llama-3.1-8B-Instruct")).use_mla


def test_sliding_window_only_when_in_force() -> None:
    # Qwen2.5 writes sliding_window 131072 with use_sliding_window false: not in force.
    assert from_config(fixture("Qwen2.5-7B-Instruct")).sliding_window is None
    mistral_v01 = {**fixture("Mistral-7B-Instruct-v0.3"), "sliding_window": 4096}
    assert from_config(mistral_v01).sliding_window == 4096


def test_multimodal_text_config() -> None:
    # Gemma 3 4B's shape: the wrapper at the top, the language model under text_config.
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27, "num_attention_heads": 16},
    }
    info = from_config(cfg)
    assert (info.architecture, info.model_type, info.num_layers, info.hidden_size) == (
        "Gemma3ForConditionalGeneration", "gemma3_text", 34, 2560)
    assert (info.num_kv_heads, info.head_dim, info.torch_dtype, info.sliding_window) == (
        4, 256, "bfloat16", 1024)


def test_hybrid_layer_types_count_only_attention_layers() -> None:
    cfg = {"num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
           "vocab_size": 1000, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2}
    info = from_config(cfg)
    assert (info.num_layers, info.num_kv_layers) == (8, 2)


def test_missing_heads_default_to_mha_and_dtype_key_spellings() -> None:
    info = from_config({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                        "vocab_size": 10, "dtype": "float16"})
    assert (info.num_kv_heads, info.head_dim, info.torch_dtype, info.architecture) == (
        4, 16, "float16", "unknown")


# --- context length as vLLM derives it ----------------------------------------------------------------
# rope_scaling values are the published ones: DeepSeek-V2-Lite-Chat's config.json (trimmed from the
# fixture), the YaRN block Qwen2.5-7B-Instruct's model card says to add for long texts, Gemma 3's linear 8x,
# Phi-3-mini-128k-instruct's LongRoPE ("su" in its first revision), c4ai-command-r-v01's model_max_length.
DEEPSEEK_YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                 "original_max_position_embeddings": 4096, "type": "yarn"}
QWEN_YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}


@pytest.mark.parametrize(("name", "extra", "limits"), [
    # llama3 RoPE: max_position_embeddings (131072) is already the extended length, not 8 x it
    ("Llama-3.1-8B-Instruct", {}, (131072, 131072)),
    ("Qwen3-30B-A3B", {}, (40960, 40960)),
    # YaRN: vLLM 0.31-0.33 take max_position_embeddings as already scaled (here 4096 x 40 anyway)
    ("DeepSeek-V2-Lite-Chat", {"rope_scaling": DEEPSEEK_YARN}, (163840, 163840)),
    # the same in transformers v5's spelling
    ("DeepSeek-V2-Lite-Chat", {"rope_parameters": {**DEEPSEEK_YARN, "rope_type": "yarn"}}, (163840, 163840)),
    # YaRN's factor is not applied again: with the model card's block vLLM 0.32.0 still refuses 32769
    # ("derived max_model_len (max_position_embeddings=32768.0 ...)"); before 0.31 it served 32768 x 4
    ("Qwen2.5-7B-Instruct", {}, (32768, 32768)),
    ("Qwen2.5-7B-Instruct", {"rope_scaling": QWEN_YARN}, (32768, 32768)),
])
def test_context_limit_of_fixture_configs(name: str, extra: dict, limits: tuple[int, int]) -> None:
    info = from_config({**fixture(name), **extra})
    assert (info.context_limit, info.default_max_model_len) == limits


def test_context_limit_rules() -> None:
    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}
    # Gemma 3 states its scaled length already (vLLM skips the factor for it)
    gemma = {**base, "model_type": "gemma3_text", "max_position_embeddings": 131072,
             "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
    assert modelinfo.context_lengths(gemma) == (131072, 131072)
    # any other model with linear scaling: x factor; per-layer-type rope_parameters (transformers v5)
    assert modelinfo.context_lengths({**gemma, "model_type": "other"}) == (1048576, 1048576)
    per_layer = {**base, "max_position_embeddings": 8192, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0},
        "sliding_attention": {"rope_type": "default"}}}
    assert modelinfo.context_lengths(per_layer) == (32768, 32768)
    # LongRoPE: the limit is max_position_embeddings; unset, vLLM serves the original (short) length
    phi3 = {**base, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"long_factor": [1.0], "short_factor": [1.0], "type": "longrope"}}
    assert modelinfo.context_lengths(phi3) == (131072, 4096)
    assert modelinfo.context_lengths({**phi3, "rope_scaling": {"type": "su"}}) == (131072, 4096)
    # the smallest length key wins, except model_max_length, which overrides
    assert modelinfo.context_lengths({**base, "max_position_embeddings": 4096, "seq_length": 2048}) == (
        2048, 2048)
    command_r = {**base, "max_position_embeddings": 8192, "model_max_length": 131072}
    assert modelinfo.context_lengths(command_r) == (131072, 131072)
    assert modelinfo.context_lengths(base) == (None, None)
    info = from_config(base)
    assert (info.context_limit, info.default_max_model_len) == (None, None)


@pytest.mark.parametrize(("qcfg", "expected"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, ("awq", 4)),
    ({"quant_method": "awq", "w_bit": 4}, ("awq", 4)),
    ({"quant_method": "gptq", "bits": 8}, ("gptq", 8)),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, ("fp8", 8)),
    ({"quant_method": "mxfp4"}, ("mxfp4", 4)),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, ("bitsandbytes", 4)),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}, ("compressed-tensors", 4)),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, ("modelopt", 4)),
    (None, (None, None)),
])
def test_quantization_spellings(qcfg: dict | None, expected: tuple) -> None:
    assert quantization_of(qcfg) == expected


def test_quantization_read_from_config() -> None:
    cfg = {**fixture("Llama-3.1-8B-Instruct"), "quantization_config": {"quant_method": "awq", "bits": 4}}
    info = from_config(cfg)
    assert (info.quantization, info.quant_bits) == ("awq", 4)


@pytest.mark.parametrize(("drop", "word"), [("num_hidden_layers", "layer count"),
                                            ("hidden_size", "hidden size"),
                                            ("vocab_size", "vocab size")])
def test_missing_key_is_named(drop: str, word: str) -> None:
    cfg = {k: v for k, v in fixture("Llama-3.1-8B-Instruct").items() if k != drop}
    with pytest.raises(ModelInfoError, match=word):
        from_config(cfg)


def test_bad_value_is_named() -> None:
    with pytest.raises(ModelInfoError, match="num_attention_heads|attention head count"):
        from_config({**fixture("Llama-3.1-8B-Instruct"), "num_attention_heads": "32"})


# --- safetensors headers ---------------------------------------------------------------------------------
def _header_only_file(path: Path, tensors: dict[str, tuple[int, int]]) -> None:
    """A safetensors file with a header and NO data after it: readable only by a header-only reader."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         **{n: {"dtype": "BF16", "shape": [(e - b) // 2], "data_offsets": [b, e]}
                            for n, (b, e) in tensors.items()}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_header_sum_matches_real_file(tmp_path: Path) -> None:
    arrays = {"a": np.zeros((3, 5), dtype=np.float32), "b": np.zeros(7, dtype=np.float16),
              "c": np.zeros((2, 2), dtype=np.int8)}
    safetensors.numpy.save_file(arrays, str(tmp_path / "model.safetensors"))
    # 3*5*4 + 7*2 + 2*2*1 = 60 + 14 + 4 = 78 bytes of tensors.
    assert weight_bytes_from_dir(tmp_path) == 78


def test_tensor_data_is_never_read(tmp_path: Path) -> None:
    # The header claims 4 GiB + 2 GiB of data that the file does not have; only the header is read.
    _header_only_file(tmp_path / "model.safetensors", {"w": (0, 4 << 30), "v": (4 << 30, 6 << 30)})
    assert weight_bytes_from_dir(tmp_path) == 6 << 30


def test_index_selects_shards_and_skips_consolidated(tmp_path: Path) -> None:
    _header_only_file(tmp_path / "model-00001-of-00002.safetensors", {"a": (0, 100)})
    _header_only_file(tmp_path / "model-00002-of-00002.safetensors", {"b": (0, 50)})
    _header_only_file(tmp_path / "consolidated.safetensors", {"a": (0, 100), "b": (100, 150)})
    index = {"metadata": {"total_size": 150},
             "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / modelinfo.INDEX_FILE).write_text(json.dumps(index))
    assert weight_bytes_from_dir(tmp_path) == 150


def test_consolidated_skipped_without_index(tmp_path: Path) -> None:
    _header_only_file(tmp_path / "model.safetensors", {"a": (0, 100)})
    _header_only_file(tmp_path / "consolidated.safetensors", {"a": (0, 100)})
    assert weight_bytes_from_dir(tmp_path) == 100


def test_index_total_size_when_shards_absent(tmp_path: Path) -> None:
    index = {"metadata": {"total_size": 16060522496},
             "weight_map": {"lm_head.weight": "model-00004-of-00004.safetensors"}}
    (tmp_path / modelinfo.INDEX_FILE).write_text(json.dumps(index))
    assert weight_bytes_from_dir(tmp_path) == 16060522496


def test_no_weights_is_none(tmp_path: Path) -> None:
    assert weight_bytes_from_dir(tmp_path) is None


def test_corrupt_headers_are_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(ModelInfoError, match="exceeds"):
        weight_bytes_from_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(ModelInfoError, match="not JSON"):
        weight_bytes_from_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ModelInfoError, match="truncated"):
        weight_bytes_from_dir(tmp_path)


def test_load_tiny_model_dir(tmp_path: Path) -> None:
    # The project's tiny model, written without the tokenizer (config + weights are all load() reads).
    config = tinymodel.model_config(vocab_size=500, bos_id=1, eos_id=2, pad_id=3)
    weights = tinymodel.make_weights(config, seed=0)
    (tmp_path / "config.json").write_text(json.dumps(config))
    safetensors.numpy.save_file(weights, str(tmp_path / "model.safetensors"))
    info = modelinfo.load(tmp_path)
    assert info.weight_bytes == sum(a.nbytes for a in weights.values())
    assert info.weight_bytes == info.param_count() * 4  # float32 on disk
    assert (info.num_layers, info.num_kv_heads, info.head_dim, info.torch_dtype) == (2, 2, 32, "float32")


def test_load_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelInfoError, match="no config.json"):
        modelinfo.load(tmp_path)
