"""vllm_fleet.core.sizing: the memory preflight. Expected values are worked out by hand in the comments,
never by
calling the code under test; GPU sizes are nvidia-smi's memory.total from tests/fixtures/nvidia."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlab import tinymodel
from vllm_fleet.core import sizing
from vllm_fleet.core.modelinfo import ModelInfo, from_config
from vllm_fleet.core.sizing import GiB, estimate, estimate_cpu, estimate_settings, kv_bytes_per_token

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "model_configs"
H100_MIB = 81559  # NVIDIA H100 80GB HBM3 (query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt)
A10G_MIB = 23028  # NVIDIA A10G (smi_table/a10g-x1-535.247.01-cuda12.2-TRUNC.txt)
GPUS_MIB = (8192, 16376, A10G_MIB, 46068, H100_MIB, 143771)


def info(name: str, *, weights: bool = True) -> ModelInfo:
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    return from_config(cfg, cfg["_weight_bytes"] if weights else None)


L8B, L70B = info("Llama-3.1-8B-Instruct"), info("Llama-3.1-70B-Instruct")
FIXTURE_INFOS = [info(p.stem) for p in sorted(FIXTURES.glob("*.json"))]
# The project's tiny model (fleetlab.tinymodel): hidden 128, 4 heads, 2 KV heads, head_dim 32, 2 layers.
TINY = from_config(tinymodel.model_config(vocab_size=500, bos_id=1, eos_id=2, pad_id=3))


# --- KV cache per token ---------------------------------------------------------------------------------
def test_kv_per_token_llama_8b_bf16() -> None:
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 131072 bytes = 128 KiB.
    assert kv_bytes_per_token(L8B, element_bytes=2) == 131072
    assert estimate(L8B, max_model_len=8192, gpu_memory_total_mib=H100_MIB).kv_bytes_per_token == 131072


def test_70b_at_tp4_per_gpu() -> None:
    est = estimate(L70B, tp=4, max_model_len=8192, gpu_memory_total_mib=H100_MIB)
    # KV: 2 x 80 layers x (8 KV heads / 4 = 2 per GPU) x 128 x 2 bytes = 81920 bytes per token per GPU.
    assert est.kv_bytes_per_token == 81920
    # Weights: 141,107,412,992 / 4 = 35,276,853,248 bytes = 32.85 GiB per GPU.
    assert est.weights_gib * GiB == 35276853248
    # One 8192-token sequence: 8192 x 81920 = 671,088,640 bytes = 0.625 GiB.
    assert est.kv_one_seq_gib == 0.625
    assert est.fits


def test_fp8_halves_kv() -> None:
    auto = estimate(L8B, max_model_len=32768, gpu_memory_total_mib=H100_MIB)
    fp8 = estimate(L8B, max_model_len=32768, kv_cache_dtype="fp8", gpu_memory_total_mib=H100_MIB)
    # 2 x 32 x 8 x 128 x 1 byte = 65536; one 32768-token sequence 4 GiB -> 2 GiB.
    assert (auto.kv_bytes_per_token, fp8.kv_bytes_per_token) == (131072, 65536)
    assert (auto.kv_one_seq_gib, fp8.kv_one_seq_gib) == (4.0, 2.0)


def test_kv_heads_replicated_beyond_their_count_and_split_over_pp() -> None:
    # TP 16 > 8 KV heads: each rank keeps max(1, 8 // 16) = 1 head: 2 x 32 x 1 x 128 x 2 = 16384.
    assert kv_bytes_per_token(L8B, tp=16, element_bytes=2) == 16384
    # PP 2 halves the layers on a GPU: 2 x 40 x 8 x 128 x 2 = 163840.
    assert kv_bytes_per_token(L70B, pp=2, element_bytes=2) == 163840


def test_mla_caches_one_latent_per_layer_on_every_rank() -> None:
    deepseek = info("DeepSeek-V2-Lite-Chat")
    # 27 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes = 31104, not divided by TP.
    assert kv_bytes_per_token(deepseek, element_bytes=2) == 31104
    assert kv_bytes_per_token(deepseek, tp=2, element_bytes=2) == 31104


# --- budget, overhead, weights --------------------------------------------------------------------------
def test_budget_and_overhead_on_h100() -> None:
    est = estimate(L8B, max_model_len=8192, max_num_seqs=256, gpu_memory_total_mib=H100_MIB)
    # 81559 MiB x 1,048,576 = 85,520,809,984 bytes; x 0.90 = 76,968,728,985.6 -> 76,968,728,985.
    assert est.budget_gib * GiB == pytest.approx(76968728985, abs=1)
    # 0.5 GiB runtime + 0.5 GiB CUDA graphs + 8192 batched tokens (vLLM's default on >= 70 GiB GPUs)
    # x 4096 hidden x 32 B = 2^13 x 2^12 x 2^5 = 1 GiB, + sampler 256 seqs x 128256 vocab x 8 B = 262,668,288.
    assert est.overhead_gib == 2 + 262668288 / GiB
    eager = estimate(L8B, max_model_len=8192, gpu_memory_total_mib=H100_MIB, enforce_eager=True)
    assert est.overhead_gib - eager.overhead_gib == 0.5


def test_batched_tokens_defaults() -> None:
    assert sizing.default_max_num_batched_tokens(H100_MIB, "NVIDIA H100 80GB HBM3") == 8192
    assert sizing.default_max_num_batched_tokens(81920, "NVIDIA A100-SXM4-80GB") == 2048  # vLLM exempts A100
    assert sizing.default_max_num_batched_tokens(A10G_MIB, "NVIDIA A10G") == 2048
    # vLLM 0.31-0.34's get_batch_defaults, read from their wheels: >= 160 GiB gets 16384 (B200: 183359
    # MiB per nvidia-smi); GB10 (12.1, 119 GiB shared) stays small from 0.33 on
    assert sizing.default_max_num_batched_tokens(183359, "NVIDIA B200", (10, 0)) == 16384
    assert sizing.default_max_num_batched_tokens(122502, "NVIDIA GB10", (12, 1)) == 2048
    assert sizing.default_max_num_batched_tokens(122502, "NVIDIA GB10", (12, 1), gb10_small=False) == 8192
    # Chunked prefill off: one step must hold a whole 32768-token prompt: 32768 x 4096 x 32 B = 4 GiB.
    est = estimate(L8B, max_model_len=32768, gpu_memory_total_mib=H100_MIB, enable_chunked_prefill=False,
                   max_num_seqs=1)
    assert est.overhead_gib == 1 + 4 + 128256 * 8 / GiB


def test_unknown_weight_bytes_from_parameter_count() -> None:
    est = estimate(info("Llama-3.1-8B-Instruct", weights=False), max_model_len=8192,
                   gpu_memory_total_mib=H100_MIB)
    # 8,030,261,248 params x 2 bytes, the same as the files; only the flag says it is an estimate.
    assert (est.weights_gib * GiB, est.weights_exact) == (16060522496, False)
    awq = dataclasses.replace(info("Llama-3.1-8B-Instruct", weights=False), quantization="awq", quant_bits=4)
    # Embeddings + LM head 2 x 128256 x 4096 = 1,050,673,152 params stay 16-bit: 2,101,346,304 bytes;
    # the other 6,979,588,096 params at 4 bits: 3,489,794,048 bytes. Total 5,591,140,352.
    assert sizing.model_weight_bytes(awq, "bfloat16") == (5591140352, False)


def test_float32_checkpoint_served_in_bf16_halves() -> None:
    tiny = dataclasses.replace(TINY, weight_bytes=4_000_000)  # torch_dtype float32 on disk
    assert sizing.resolve_dtype("auto", tiny) == "bfloat16"
    assert sizing.model_weight_bytes(tiny, "bfloat16") == (2_000_000, True)
    assert sizing.model_weight_bytes(tiny, "float32") == (4_000_000, True)


def test_invalid_tp_is_refused_like_vllm() -> None:
    with pytest.raises(ValueError, match="does not split"):
        estimate(L8B, tp=3, max_model_len=8192, gpu_memory_total_mib=H100_MIB)


# --- refusals and ways out ------------------------------------------------------------------------------
def test_a10g_refusal_message() -> None:
    est = estimate(L8B, max_model_len=32768, gpu_memory_total_mib=A10G_MIB, gpu_name="A10G")
    # Budget: 23028 MiB = 24,146,608,128 B (22.49 GiB) x 0.90 -> 21,731,947,315 B = 20.24 GiB.
    # Weights 16,060,522,496 B = 14.96 GiB; KV 32768 x 131072 = 4 GiB; overhead 1 GiB + 2048 tokens (the
    # default below 70 GiB) x 4096 x 32 B = 0.25 GiB + 262,668,288 B sampler = 1,604,845,568 B = 1.49 GiB.
    # Needed 21,960,335,360 B = 20.45 GiB > 20.24.
    # Ways out: KV room 21,731,947,315 - 16,060,522,496 - 1,604,845,568 = 4,066,579,251 B holds 1939 blocks
    # of 16 x 131072 = 2,097,152 B = 31,024 tokens -> 30976 (121 x 256). TP 2 halves weights and KV.
    # fp8: 16,060,522,496 + 2 GiB + 1,604,845,568 = 19,812,851,712 <= budget. Utilization:
    # 21,960,335,360 / 24,146,608,128 = 0.9095 -> 0.91.
    assert not est.fits
    assert est.refusal("lab1", "default") == (
        "lab1: vllm.instances[default]: needs 20.5 GiB per GPU, has 20.2 GiB at 0.90 (22.5 GiB A10G): "
        "weights 15.0 GiB + KV for one 32768-token sequence 4.0 GiB + overhead 1.5 GiB; "
        "ways out: max_model_len <= 30976, or tensor_parallel_size 2, or kv_cache_dtype fp8, "
        "or gpu_memory_utilization 0.91"
    )
    for way in est.ways_out:
        assert estimate_settings(L8B, way.settings).fits, way


def test_70b_on_one_80g_gpu_needs_tp() -> None:
    est = estimate(L70B, max_model_len=8192, gpu_memory_total_mib=H100_MIB, gpu_name="H100")
    # Weights alone, 141,107,412,992 B = 131.4 GiB, exceed the 71.68 GiB budget: no context length, KV
    # dtype or utilization helps. TP 2: 65.71 GiB weights + 8192 x 163,840 B = 1.25 GiB KV + overhead
    # (1 GiB + 8192 x 8192 x 32 B = 2 GiB + 0.245 GiB sampler) = 70.2 GiB <= 71.68.
    assert not est.fits
    assert [(w.flag, w.value) for w in est.ways_out] == [("tensor_parallel_size", 2)]
    assert "ways out: tensor_parallel_size 2" in est.refusal("gpu7", "big")
    for way in est.ways_out:
        assert estimate_settings(L70B, way.settings).fits



def test_tp_beyond_the_instance_gpus_is_said_as_more_gpus() -> None:
    # The same 70B with one GPU for the instance (max_tp 1): TP 2 is no way out the planner would accept
    # for it, so it comes as "more GPUs", with whether this host has them.
    one = estimate(L70B, max_model_len=8192, gpu_memory_total_mib=H100_MIB, gpu_name="H100", max_tp=1)
    assert one.ways_out == ()
    assert one.more_gpus is not None and one.more_gpus.value == 2
    assert estimate_settings(L70B, one.more_gpus.settings).fits
    # 81559 MiB = 79.6 GiB
    assert one.refusal("gpu7", "big", host_gpus=1).endswith(
        "; ways out: more GPUs than this instance has (1): tensor_parallel_size 2 over 2 GPUs, so a host "
        "with 2 GPUs of 79.6 GiB (this one has 1)")
    assert one.refusal("gpu7", "big", host_gpus=4).endswith(
        "; ways out: more GPUs than this instance has (1): tensor_parallel_size 2 over 2 GPUs "
        "(gpus: 2; this host has 4)")
    assert "tensor_parallel_size 2 over 2 GPUs of 79.6 GiB" in one.refusal("gpu7", "big")
    # Llama-3.1-70B has 64 attention heads, so TP stops at 64: on 2 GiB cards (budget 1.8 GiB) even its
    # weights at TP 64, 141,107,412,992 / 64 B = 2.05 GiB, do not fit.
    none = estimate(L70B, max_model_len=8192, gpu_memory_total_mib=2048, max_tp=1)
    assert (none.ways_out, none.more_gpus) == ((), None)
    assert none.refusal("gpu7", "big").endswith("; no single setting change fits: use GPUs with more memory")


def test_tp_ways_out_stay_within_max_tp_and_the_heads_rule() -> None:
    # Qwen2.5-7B: 28 heads, 4 KV heads, so the planner's rule allows TP 1, 2, 4 and 28 (3 does not divide
    # 28; 7 and 14 divide it but neither split nor replicate the 4 KV heads). On 8 GiB cards (budget
    # 7.2 GiB) its 14.19 GiB of weights need TP 4 (3.55 GiB each; TP 2 leaves 7.1 GiB). With 3 GPUs for
    # the instance TP 4 is more GPUs than it has.
    qwen = info("Qwen2.5-7B-Instruct")
    est = estimate(qwen, max_model_len=4096, max_num_seqs=8, gpu_memory_total_mib=8192, max_tp=8)
    assert [(w.flag, w.value) for w in est.ways_out if w.flag == "tensor_parallel_size"] == [
        ("tensor_parallel_size", 4)]
    assert est.more_gpus is None
    three = estimate(qwen, max_model_len=4096, max_num_seqs=8, gpu_memory_total_mib=8192, max_tp=3)
    assert not [w for w in three.ways_out if w.flag == "tensor_parallel_size"]
    assert three.more_gpus is not None and three.more_gpus.value == 4


def test_max_model_len_way_out_stays_within_the_model_limit() -> None:
    # Llama-3.1-8B's limit is 131072 (llama3 RoPE: max_position_embeddings already extended). Asked for
    # 1,048,576 tokens on an H100, the KV room (446,304 tokens, test_too_few_kv_slots_...) would allow more
    # than the model takes, so the way out is the model's limit, named as such.
    est = estimate(L8B, max_model_len=1_048_576, max_num_seqs=1, gpu_memory_total_mib=H100_MIB)
    lengths = [w for w in est.ways_out if w.flag == "max_model_len"]
    assert [(w.value, str(w)) for w in lengths] == [(131072, "max_model_len <= 131072 (the model's limit)")]
    cpu = estimate_cpu(L8B, max_model_len=1_048_576, max_num_seqs=1, kvcache_gib=64)
    # 64 GiB / 128 KiB per token = 524,288 tokens > 131072
    assert not cpu.fits
    assert cpu.refusal("lab2", "default").endswith("or max_model_len <= 131072 (the model's limit)")


def test_too_few_kv_slots_is_concurrency_not_refusal() -> None:
    est = estimate(L8B, max_model_len=131072, max_num_seqs=256, gpu_memory_total_mib=H100_MIB)
    # KV room: 76,968,728,985 - 16,060,522,496 - 2,410,151,936 overhead = 58,498,054,553 B = 27,894 blocks
    # of 2,097,152 B (446,304 tokens); one 131072-token sequence is 8192 blocks: 27894 / 8192 = 3.405x.
    assert est.fits and not est.all_seqs_fit
    assert est.kv_capacity_tokens == 446304
    assert est.max_concurrency == 27894 / 8192
    assert est.concurrency == 3
    assert est.kv_all_seqs_gib == 256 * 16.0
    assert "at most 3 of max_num_seqs 256" in est.summary("lab1", "default")
    with pytest.raises(ValueError, match="nothing to refuse"):
        est.refusal("lab1", "default")


# --- CPU hosts ----------------------------------------------------------------------------------------------
def test_cpu_tiny_model_matches_vllm_log() -> None:
    # From vLLM 0.32 (CPU build) on this project's lab host, serving the tiny model in bf16 with
    # VLLM_CPU_KVCACHE_SPACE=1 and max_model_len 512:
    #   "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x"
    # By hand: 2 x 2 layers x 2 KV heads x 32 head_dim x 2 bytes = 512 B per token; 2^30 / 512 = 2,097,152
    # tokens; 2,097,152 / 512 = 4096 requests.
    est = estimate_cpu(TINY, max_model_len=512, max_num_seqs=8, kvcache_gib=1)
    assert est.dtype == "bfloat16"  # torch_dtype float32 in config.json, served as bf16 by vLLM's "auto"
    assert est.kv_bytes_per_token == 512
    assert est.kv_capacity_tokens == 2_097_152
    assert est.max_concurrency == 4096.0
    assert est.vllm_log_lines() == ("CPU KV cache size: 2,097,152 tokens",
                                    "Maximum concurrency for 512 tokens per request: 4096.00x")
    assert est.fits and est.concurrency == 8


def test_cpu_refusal() -> None:
    # One 4,194,304-token sequence x 512 B = 2 GiB > 1 GiB of VLLM_CPU_KVCACHE_SPACE. The 1 GiB holds
    # 2,097,152 tokens, but the tiny model's max_position_embeddings is 2048, so that is the length offered.
    est = estimate_cpu(TINY, max_model_len=4_194_304, max_num_seqs=1, kvcache_gib=1)
    assert not est.fits and est.min_kvcache_gib == 2
    assert est.refusal("lab2", "default") == (
        "lab2: vllm.instances[default]: one 4194304-token sequence needs 2.00 GiB of KV cache, "
        "VLLM_CPU_KVCACHE_SPACE gives 1 GiB (2,097,152 tokens); ways out: VLLM_CPU_KVCACHE_SPACE=2, "
        "or max_model_len <= 2048 (the model's limit)"
    )
    # a model without a stated limit gets the length the space holds
    unbounded = dataclasses.replace(TINY, max_position_embeddings=None, max_model_len_limit=None)
    assert estimate_cpu(unbounded, max_model_len=4_194_304, max_num_seqs=1, kvcache_gib=1).refusal(
        "lab2", "default").endswith("or max_model_len <= 2097152")


# --- properties ----------------------------------------------------------------------------------------
@st.composite
def models(draw: st.DrawFn) -> ModelInfo:
    if draw(st.booleans()):
        return draw(st.sampled_from(FIXTURE_INFOS))
    heads = draw(st.sampled_from([4, 8, 16, 32, 64, 128]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32, 64, 128) if heads % d == 0]))
    head_dim = draw(st.sampled_from([32, 64, 128, 256]))
    return ModelInfo(
        architecture="LlamaForCausalLM", model_type="llama", num_layers=draw(st.integers(1, 128)),
        hidden_size=heads * head_dim, intermediate_size=draw(st.integers(64, 65536)),
        num_attention_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        vocab_size=draw(st.integers(256, 262144)), max_position_embeddings=131072,
        torch_dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        weight_bytes=draw(st.one_of(st.none(), st.integers(10**6, 10**12))),
    )


def valid_tps(m: ModelInfo) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if sizing.valid_tp(m, t)]


common = {
    "gpu_memory_total_mib": st.sampled_from(GPUS_MIB),
    "gpu_memory_utilization": st.floats(0.3, 0.95),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8"]),
}
PROPS = settings(max_examples=60, deadline=None)


@PROPS
@given(m=models(), lens=st.lists(st.integers(16, 262144), min_size=2, max_size=2), seqs=st.integers(1, 1024),
       **common)
def test_monotonic_in_max_model_len(m: ModelInfo, lens: list[int], seqs: int, **kw: object) -> None:
    short, long = (estimate(m, max_model_len=n, max_num_seqs=seqs, **kw) for n in sorted(lens))
    assert short.needed_gib <= long.needed_gib
    assert short.kv_all_seqs_gib <= long.kv_all_seqs_gib
    assert short.max_concurrency >= long.max_concurrency
    assert short.fits or not long.fits


@PROPS
@given(m=models(), n=st.lists(st.integers(1, 2048), min_size=2, max_size=2), length=st.integers(16, 131072),
       **common)
def test_monotonic_in_max_num_seqs(m: ModelInfo, n: list[int], length: int, **kw: object) -> None:
    few, many = (estimate(m, max_model_len=length, max_num_seqs=k, **kw) for k in sorted(n))
    assert few.needed_gib <= many.needed_gib
    assert few.kv_all_seqs_gib <= many.kv_all_seqs_gib
    assert few.fits or not many.fits


@PROPS
@given(m=models(), data=st.data(), length=st.integers(16, 131072), seqs=st.integers(1, 1024), **common)
def test_decreasing_in_tp(m: ModelInfo, data: st.DataObject, length: int, seqs: int, **kw: object) -> None:
    tps = sorted(data.draw(st.lists(st.sampled_from(valid_tps(m)), min_size=2, max_size=2)))
    low, high = (estimate(m, tp=t, max_model_len=length, max_num_seqs=seqs, **kw) for t in tps)
    assert high.needed_gib <= low.needed_gib
    assert high.weights_gib <= low.weights_gib
    assert high.kv_bytes_per_token <= low.kv_bytes_per_token
    assert high.fits or not low.fits


FIELD = {"tensor_parallel_size": "tp"}


@PROPS
@given(m=models(), data=st.data(), length=st.integers(256, 262144), seqs=st.integers(1, 1024), **common)
def test_ways_out_always_fit(m: ModelInfo, data: st.DataObject, length: int, seqs: int, **kw: object) -> None:
    tp = data.draw(st.sampled_from(valid_tps(m)))
    est = estimate(m, tp=tp, max_model_len=length, max_num_seqs=seqs, **kw)
    if est.fits:
        assert est.ways_out == ()
        return
    for way in est.ways_out:
        assert estimate_settings(m, way.settings).fits, way
        changed = {f.name for f in dataclasses.fields(way.settings)
                   if getattr(way.settings, f.name) != getattr(est.settings, f.name)}
        assert changed == {FIELD.get(way.flag, way.flag)}
        if way.flag == "max_model_len":
            limit = m.context_limit or length
            assert way.value < length and way.value <= limit
            assert way.value % 256 == 0 or way.value == limit
            if way.value + 256 < length and way.value < limit:  # the largest: one step more does not fit
                bigger = dataclasses.replace(est.settings, max_model_len=way.value + 256)
                assert not estimate_settings(m, bigger).fits
        if way.flag == "tensor_parallel_size":
            assert sizing.valid_tp(m, way.value) and tp < way.value <= sizing.DEFAULT_MAX_TP
            for smaller in range(tp + 1, way.value):  # the smallest TP that fits
                if sizing.valid_tp(m, smaller):
                    assert not estimate_settings(m, dataclasses.replace(est.settings, tp=smaller)).fits
        if way.flag == "gpu_memory_utilization":
            assert est.settings.gpu_memory_utilization < way.value <= 0.95
    tps = [w for w in est.ways_out if w.flag == "tensor_parallel_size"]
    if est.more_gpus is not None:  # only when no TP the instance has fits
        assert not tps and est.more_gpus.value > sizing.DEFAULT_MAX_TP
        assert estimate_settings(m, est.more_gpus.settings).fits


# --- docs ----------------------------------------------------------------------------------------------
DOC_MODELS = ["Llama-3.1-8B-Instruct", "Mistral-7B-Instruct-v0.3", "Qwen2.5-7B-Instruct",
              "Mixtral-8x7B-Instruct-v0.1", "Llama-3.1-70B-Instruct", "Qwen3-30B-A3B",
              "DeepSeek-V2-Lite-Chat"]
DOC_SETTINGS = {"max_model_len": 8192, "max_num_seqs": 256, "gpu_memory_total_mib": H100_MIB,
                "gpu_memory_utilization": 0.90, "gpu_name": "H100 80GB HBM3"}


def test_docs_table_is_current() -> None:
    text = (ROOT / "docs" / "sizing.md").read_text()
    block = re.search(r"<!-- sizing-table:start -->\n(.*?)\n<!-- sizing-table:end -->", text, re.S)
    assert block, "docs/sizing.md lost its table markers"
    assert block[1] == sizing.fleet_table([(n, info(n)) for n in DOC_MODELS], **DOC_SETTINGS)
