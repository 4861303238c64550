"""vllm_fleet.core.startup: the refusals vLLM makes at start-up, decided at plan time.

Where the inputs come from:
* Models: tests/fixtures/model_configs/*.json (published config.json files, each names its source). Where
  a case needs a config no fixture has (a quantized checkpoint, a RoPE variant), a fixture is combined with
  the published ``quantization_config`` / ``rope_scaling`` of the named Hugging Face repo, quoted inline.
* GPUs: parsed from the real nvidia-smi captures of tests/fixtures/nvidia (INDEX.md gives their sources).
* Host ports: ``ss -ltnp`` as printed on this project's dev machine (the VllmHost fact's own command, run
  there), plus vllm units in the cgroup v2 form systemd writes (see test_vllm_host_fact.py).
* What vLLM says: the messages are vLLM 0.32.0's (quoted in vllm_fleet/core/startup.py and
  docs/startup-refusals.md); the cases marked "observed" were run against the vLLM 0.32.0 CPU build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from tests.nvidia_captures import capture
from vllm_fleet.core.flags import ServeFlags, render_flags
from vllm_fleet.core.gpus import Gpu, parse_query_csv, parse_smi_table
from vllm_fleet.core.startup import (
    HostPorts,
    Listener,
    context_length,
    quant_table,
    startup_refusals,
)
from vllm_fleet.core.variants import load_table
from vllm_fleet.roles.facts import VllmHost

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
HOST, INST = "gpu-07", "chat"


def model(name: str, **over: Any) -> dict[str, Any]:
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    cfg.update(over)
    return cfg


def query_gpu(name: str) -> Gpu:
    (gpu,) = parse_query_csv(capture(f"query_csv/{name}"), fields=None)
    return gpu


def table_gpu(name: str) -> Gpu:
    return parse_smi_table(capture(f"smi_table/{name}")).gpus[0].to_gpu()


RTX2080 = query_gpu("ue-nvidia-geforce-rtx-2080-super-595.71.05-idle.txt")  # 7.5, 8 GiB
L40S = query_gpu("ue-nvidia-l40s-595.80-idle.txt")  # 8.9, 45 GiB
H100 = query_gpu("ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt")  # 9.0, 80 GiB
A100 = table_gpu("a100-pcie-40gb-x2-555.42.02-cuda12.5.txt")  # 8.0
RTX3090 = table_gpu("rtx3090-x4-595.84-cuda13.2-TRUNC.txt")  # 8.6, 24 GiB
H200 = table_gpu("h200-x1plus-570.86.15-cuda12.8-TRUNC.txt")  # 9.0, 140 GiB
A800_80 = table_gpu("a800-80gb-pcie-x2plus-550.54.15-cuda12.4-TRUNC.txt")  # 8.0, 80 GiB, not "A100"

# huggingface.co/Qwen/Qwen2.5-7B-Instruct-AWQ/blob/main/config.json
AWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
       "zero_point": True}
# huggingface.co/Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4/blob/main/config.json
GPTQ = {"bits": 4, "damp_percent": 0.01, "dataset": None, "desc_act": False, "group_size": 128,
        "modules_in_block_to_quantize": None, "quant_method": "gptq", "sym": True, "true_sequential": True}
# huggingface.co/meta-llama/Llama-3.1-405B-Instruct-FP8/blob/main/config.json (modules list shortened)
FBGEMM = {"activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"], "quant_method": "fbgemm_fp8"}
# huggingface.co/unsloth/llama-3-8b-Instruct-bnb-4bit/blob/main/config.json (transformers' BitsAndBytesConfig)
BNB = {"bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
       "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False, "quant_method": "bitsandbytes"}
# huggingface.co/openai/gpt-oss-20b/blob/main/config.json
MXFP4 = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                    "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
# huggingface.co/google/gemma-2-9b-it/blob/main/config.json (the keys the checks read)
GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256,
          "hidden_size": 3584, "intermediate_size": 14336, "max_position_embeddings": 8192,
          "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
          "sliding_window": 4096, "vocab_size": 256000, "torch_dtype": "float32"}
# huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json (head_dim 3072 / 32 = 96)
PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
        "intermediate_size": 8192, "max_position_embeddings": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "rope_scaling": None, "sliding_window": 2047,
        "vocab_size": 32064, "torch_dtype": "bfloat16"}
# The flags line of this dev machine's /proc/cpuinfo (AMD EPYC, Zen 4), as the VllmHost fact reads it;
# AVX2_ONLY drops AVX-512, as on a Zen 3 EPYC.
EPYC_LINE = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch osvw topoext vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid "
    "avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt "
    "xsavec xgetbv1 xsaves avx512_bf16 clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni vaes "
    "vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm")
EPYC_FLAGS = frozenset(EPYC_LINE.split())
AVX2_ONLY = frozenset(f for f in EPYC_FLAGS if not f.startswith("avx512"))


def flags(accelerator: str = "cuda", version: str = "0.32.0", **over: Any) -> dict[str, Any]:
    """Rendered flags as the planner makes them: its derived values, then the inventory's."""
    planned: dict[str, Any] = {"model": "/var/lib/vllm/models/m", "served_model_name": "m",
                               "dtype": "bfloat16"}
    if accelerator == "cuda":
        planned.update(tensor_parallel_size=1, block_size=16)
    planned.update(over)
    return render_flags(ServeFlags(**planned), version, accelerator)


def refusals(fl: dict[str, Any], *, accelerator: str = "cuda", version: str = "0.32.0",
             **kw: Any) -> list[str]:
    if accelerator == "cuda":
        kw.setdefault("gpus", [H100])
    return startup_refusals(HOST, INST, fl, vllm_version=version, accelerator=accelerator, **kw)


def one(lines: list[str], field: str) -> str:
    """The single refusal, checked to name this host, instance and field."""
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{HOST}: vllm.instances[{INST}].{field}: "), lines[0]
    return lines[0]


def test_a_planned_instance_that_vllm_starts_has_no_refusal() -> None:
    assert refusals(flags(), model_config=model("Llama-3.1-8B-Instruct"), gpus=[H100]) == []
    assert refusals(flags("cpu", enforce_eager=True), accelerator="cpu",
                    model_config=model("Qwen2.5-7B-Instruct"), cpu_flags=EPYC_FLAGS) == []


# --- quantization -----------------------------------------------------------------------------------------
# Releases in variants.toml whose source was not read for quantization.toml (they get no quantization check).
QUANT_NOT_READ = {"0.20.0"}


def test_every_release_in_variants_toml_has_a_quantization_section() -> None:
    # a release added to variants.toml without its section would skip the method and deprecation checks
    table = quant_table()
    assert set(load_table()) - set(table.methods) == QUANT_NOT_READ
    assert set(table.methods) <= set(load_table())
    assert set(table.deprecated) == set(table.methods)


def test_the_table_holds_each_release_and_the_schema_offers_only_their_methods() -> None:
    table = quant_table()
    assert set(table.methods) == {"0.31.0", "0.32.0", "0.33.0", "0.34.0"}
    schema = set(get_args(get_args(ServeFlags.model_fields["quantization"].annotation)[0]))
    for methods in table.methods.values():
        assert schema - set(methods) == set()  # bitsandbytes was offered; no release has it


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0", "0.33.0", "0.34.0"])
def test_unknown_quantization_method_refused_with_the_release_list(version: str) -> None:
    # the schema no longer offers it; the check stays for a release table that drops a method
    line = one(refusals({**flags(version=version), "quantization": "bitsandbytes"}, version=version,
                        model_config=model("Llama-3.1-8B-Instruct")), "flags.quantization")
    assert "Unknown quantization method: bitsandbytes" in line
    assert line.endswith("allowed: " + ", ".join(quant_table().methods[version]))


def test_a_bitsandbytes_checkpoint_is_refused_on_the_model() -> None:
    bnb_model = model("Llama-3.1-8B-Instruct", quantization_config=BNB)
    line = one(refusals(flags(), model_config=bnb_model), "model")
    assert "quant_method 'bitsandbytes'" in line and "allowed: a checkpoint quantized with one of awq" in line


def test_flag_that_does_not_match_the_checkpoint_is_refused() -> None:
    awq_model = model("Qwen2.5-7B-Instruct", quantization_config=AWQ, torch_dtype="float16")
    line = one(refusals(flags(quantization="gptq", dtype="float16"), model_config=awq_model),
               "flags.quantization")
    assert "does not match the quantization method specified in the `quantization` argument (gptq)" in line
    assert "allowed: awq, awq_marlin, auto_awq, marlin, or leave quantization unset" in line
    # AutoAWQConfig claims awq_marlin on CUDA only ("Don't override on CPU"): observed on the 0.32.0 CPU build
    assert refusals(flags(quantization="awq_marlin", dtype="float16"), model_config=awq_model) == []
    cpu = one(refusals(flags("cpu", quantization="awq_marlin", dtype="float16"), accelerator="cpu",
                       model_config=awq_model), "flags.quantization")
    assert cpu.endswith("allowed: awq, or leave quantization unset (vLLM reads it from the checkpoint)")
    gptq_model = model("Qwen2.5-7B-Instruct", quantization_config=GPTQ)
    assert refusals(flags("cpu", quantization="gptq_marlin"), accelerator="cpu",
                    model_config=gptq_model) == []


def test_deprecated_fbgemm_checkpoint_needs_the_bypass_flag() -> None:
    fp8_model = model("Llama-3.1-8B-Instruct", quantization_config=FBGEMM)
    line = one(refusals(flags(), model_config=fp8_model), "model")
    assert "The quantization method fbgemm_fp8 is deprecated" in line
    assert "allowed: extra_args allow-deprecated-quantization: true" in line
    bypass = flags(extra_args={"allow-deprecated-quantization": True})
    assert refusals(bypass, model_config=fp8_model) == []


# The keys FPQuantConfig.from_config reads (vLLM 0.33.0 fp_quant.py); the values are illustrative
FP_QUANT = {"quant_method": "fp_quant", "forward_dtype": "mxfp4", "forward_method": "abs_max",
            "hadamard_group_size": 32, "modules_to_not_convert": ["lm_head"]}
# The keys W4AFP8Config.from_config reads (vLLM 0.34.0 w4afp8.py), at its defaults
W4AFP8 = {"quant_method": "w4afp8", "group_size": 128, "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head"]}


def test_fp_quant_is_deprecated_on_0_33_and_gone_on_0_34() -> None:
    fp_quant_model = model("Llama-3.1-8B-Instruct", quantization_config=FP_QUANT)
    bypass = {"allow-deprecated-quantization": True}
    line = one(refusals(flags(version="0.33.0"), version="0.33.0", model_config=fp_quant_model), "model")
    assert "The quantization method fp_quant is deprecated" in line
    assert refusals(flags(version="0.33.0", extra_args=bypass), version="0.33.0",
                    model_config=fp_quant_model) == []
    # 0.34.0 removed FPQuantConfig: the bypass no longer helps
    gone = one(refusals(flags(version="0.34.0", extra_args=bypass), version="0.34.0",
                        model_config=fp_quant_model), "model")
    assert "quant_method 'fp_quant', which vLLM 0.34.0 refuses at start-up" in gone
    assert "Unknown quantization method: fp_quant" in gone and "deprecated" not in gone


def test_w4afp8_checkpoints_start_on_0_34_only() -> None:
    moe = model("Qwen3-30B-A3B", quantization_config=W4AFP8)
    assert refusals(flags(version="0.34.0"), version="0.34.0", model_config=moe) == []
    old = one(refusals(flags(version="0.33.0"), version="0.33.0", model_config=moe), "model")
    assert "quant_method 'w4afp8', which vLLM 0.33.0 refuses" in old
    # no override claims the checkpoint: a flag naming another method is a mismatch
    mismatch = one(refusals(flags(version="0.34.0", quantization="fp8"), version="0.34.0", model_config=moe),
                   "flags.quantization")
    assert "does not match the quantization method specified in the `quantization` argument (fp8)" in mismatch
    assert "allowed: w4afp8, or leave quantization unset" in mismatch
    # W4AFP8Config keeps Fp8Config's activation dtypes
    f32 = one(refusals(flags(version="0.34.0", dtype="float32"), version="0.34.0", model_config=moe),
              "flags.dtype")
    assert "torch.float32 is not supported for quantization method w4afp8." in f32
    assert f32.endswith("allowed: bfloat16, float16")


def test_minimum_capability_of_the_checkpoint_method() -> None:
    gpt_oss_like = model("Qwen3-30B-A3B", quantization_config=MXFP4)
    # float16, the planner's choice on Turing, is refused as well (mxfp4 runs in bfloat16 only)
    lines = refusals(flags(dtype="float16"), model_config=gpt_oss_like, gpus=[RTX2080])
    assert len(lines) == 2 and any(".flags.dtype:" in ln for ln in lines)
    cap = [ln for ln in lines if ".flags.quantization:" in ln]
    assert len(cap) == 1 and "Minimum capability: 80. Current capability: 75." in cap[0]
    assert "GPU 0 NVIDIA GeForce RTX 2080 SUPER (compute capability 7.5)" in cap[0]
    assert cap[0].endswith("allowed: GPUs of compute capability 8.0 or newer, or another quantization")
    assert refusals(flags(), model_config=gpt_oss_like, gpus=[L40S]) == []


def test_activation_dtype_of_the_quantization_method() -> None:
    awq_model = model("Qwen2.5-7B-Instruct", quantization_config=AWQ)
    # observed on the 0.32.0 CPU build: "torch.float32 is not supported for quantization method awq"
    cpu = one(refusals(flags("cpu", dtype="float32"), accelerator="cpu", model_config=awq_model),
              "flags.dtype")
    assert "torch.float32 is not supported for quantization method awq." in cpu
    assert cpu.endswith("allowed: float16, bfloat16")
    # on CUDA AutoAWQConfig claims the checkpoint, and vLLM names it by its own name
    line = one(refusals(flags(dtype="float32"), model_config=awq_model), "flags.dtype")
    assert "torch.float32 is not supported for quantization method auto_awq." in line
    mxfp4_model = model("Qwen3-30B-A3B", quantization_config=MXFP4)
    mxfp4 = one(refusals(flags(dtype="float16"), model_config=mxfp4_model, gpus=[L40S]), "flags.dtype")
    assert mxfp4.endswith("allowed: bfloat16")
    # fp8 on an unquantized model quantizes while loading (OnlineQuantizationConfig): float16 is fine
    assert refusals(flags(quantization="fp8", dtype="float16"), model_config=model("Llama-3.1-8B-Instruct"),
                    gpus=[L40S]) == []


# --- max_model_len ----------------------------------------------------------------------------------------
def test_context_length_as_vllm_derives_it() -> None:
    """Each value here was also what vLLM 0.32.0's ModelConfig derived from the same config.json (its
    default max_model_len accepted, one more refused), on the CPU build."""
    llama = context_length(model("Llama-3.1-8B-Instruct"))
    assert llama is not None and (llama.limit, llama.key) == (131072, "max_position_embeddings")  # llama3
    deepseek = context_length(model("DeepSeek-V2-Lite-Chat"))
    assert deepseek is not None and deepseek.limit == 163840
    # huggingface.co/lmsys/vicuna-7b-v1.5-16k: linear RoPE x4 over 4096 positions
    vicuna = context_length(model("Llama-3.1-8B-Instruct", max_position_embeddings=4096,
                                  rope_scaling={"factor": 4.0, "type": "linear"}))
    assert vicuna is not None and (vicuna.limit, vicuna.rope_factor) == (16384, 4.0)
    # huggingface.co/microsoft/Phi-3-mini-128k-instruct: LongRoPE, vLLM defaults to the short context
    phi = context_length({**PHI3, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                          "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}})
    assert phi is not None and (phi.limit, phi.default) == (131072, 4096)
    assert context_length({"num_attention_heads": 4, "hidden_size": 64}) is None  # transformers' default


def test_max_model_len_above_the_model_is_refused() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    assert refusals(flags(max_model_len=131072), model_config=llama) == []
    line = one(refusals(flags(max_model_len=131073), model_config=llama), "flags.max_model_len")
    assert "User-specified max_model_len (131073) is greater than the derived max_model_len" in line
    assert "allowed: up to 131072" in line
    allowed_env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    assert refusals(flags(max_model_len=131073), model_config=llama, environment=allowed_env) == []
    assert refusals(flags(max_model_len=131073), model_config=None) == []  # hub model: vLLM decides


def test_yarn_from_the_qwen_model_card_does_not_extend_the_limit() -> None:
    # Qwen2.5-7B-Instruct's model card adds this rope_scaling for 128K; vLLM 0.31-0.33 keep YaRN's
    # max_position_embeddings (observed on the 0.32.0 CPU build: 131072 refused, 32768 accepted)
    qwen = model("Qwen2.5-7B-Instruct",
                 rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"})
    line = one(refusals(flags(max_model_len=131072), model_config=qwen), "flags.max_model_len")
    assert "allowed: up to 32768" in line and "YaRN's factor is not applied" in line
    assert refusals(flags(max_model_len=32768), model_config=qwen) == []


def test_disable_sliding_window_caps_the_limit() -> None:
    # huggingface.co/mistralai/Mistral-7B-v0.1: sliding_window 4096 over 32768 positions
    mistral = model("Mistral-7B-Instruct-v0.3", sliding_window=4096)
    assert refusals(flags(max_model_len=8192), model_config=mistral) == []
    capped = flags(max_model_len=8192, extra_args={"disable-sliding-window": True})
    line = one(refusals(capped, model_config=mistral), "flags.max_model_len")
    assert "(sliding_window)" in line and "allowed: up to 4096" in line


# --- dtype and KV cache dtype -----------------------------------------------------------------------------
def test_float16_refused_for_gemma2_and_the_planner_choice_on_turing() -> None:
    line = one(refusals(flags(dtype="float16"), model_config=GEMMA2, gpus=[RTX2080]), "flags.dtype")
    assert "The model type 'gemma2' does not support float16" in line
    assert line.endswith("allowed: float32")  # Turing has no bfloat16 either
    assert one(refusals(flags(dtype="float16"), model_config=GEMMA2, gpus=[L40S]), "flags.dtype").endswith(
        "allowed: bfloat16, float32")
    assert refusals(flags(dtype="float32"), model_config=GEMMA2, gpus=[RTX2080]) == []


def test_bfloat16_refused_below_ampere() -> None:
    line = one(refusals(flags(dtype="bfloat16"), model_config=model("Llama-3.1-8B-Instruct"), gpus=[RTX2080]),
               "flags.dtype")
    assert ("Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your NVIDIA "
            "GeForce RTX 2080 SUPER GPU has compute capability 7.5.") in line
    assert refusals(flags(dtype="bfloat16"), model_config=model("Llama-3.1-8B-Instruct"), gpus=[A100]) == []


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_on_gpus_without_a_backend_for_it(kv: str) -> None:
    llama = model("Llama-3.1-8B-Instruct")
    line = one(refusals(flags(dtype="float16", kv_cache_dtype=kv), model_config=llama, gpus=[RTX2080]),
               "flags.kv_cache_dtype")
    assert "FP8 KV cache is not supported by the Triton attention backend" in line
    assert "allowed: auto (or float16), or GPUs of compute capability 8.9 or newer" in line
    assert refusals(flags(kv_cache_dtype=kv), model_config=llama, gpus=[A100]) == []  # FlashInfer, head 128
    assert refusals(flags(kv_cache_dtype=kv), model_config=llama, gpus=[L40S]) == []
    phi = one(refusals(flags(kv_cache_dtype=kv), model_config=PHI3, gpus=[RTX3090]), "flags.kv_cache_dtype")
    assert "head_dim 96" in phi


def test_fp8_kv_cache_on_cpu() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    fl = flags("cpu", kv_cache_dtype="fp8")
    assert refusals(fl, accelerator="cpu", model_config=llama, cpu_flags=EPYC_FLAGS) == []
    old = one(refusals(fl, accelerator="cpu", model_config=llama, cpu_flags=AVX2_ONLY),
              "flags.kv_cache_dtype")
    assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX." in old
    new = one(refusals(flags("cpu", "0.33.0", kv_cache_dtype="fp8"), accelerator="cpu", version="0.33.0",
                       model_config=llama, cpu_flags=AVX2_ONLY), "flags.kv_cache_dtype")
    assert "--kv-cache-dtype fp8 is not supported by the CPU attention backend on this host." in new
    mla = one(refusals(flags("cpu", "0.33.0", kv_cache_dtype="fp8"), accelerator="cpu", version="0.33.0",
                       model_config=model("DeepSeek-V2-Lite-Chat"), cpu_flags=EPYC_FLAGS),
              "flags.kv_cache_dtype")
    assert "not supported by MLA attention on CPU" in mla
    head80 = model("Llama-3.1-8B-Instruct", head_dim=80)
    line = one(refusals(fl, accelerator="cpu", model_config=head80, cpu_flags=EPYC_FLAGS),
               "flags.kv_cache_dtype")
    assert "FP8 KV cache requires head_size divisible by 32 on CPU." in line


# --- scheduler --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("gpu", "default"), [(RTX2080, 2048), (A100, 2048), (H100, 8192), (H200, 8192),
                                              (A800_80, 8192)])
def test_max_num_seqs_above_vllms_default_batch(gpu: Gpu, default: int) -> None:
    llama = model("Llama-3.1-8B-Instruct")
    assert refusals(flags(dtype="float16", max_num_seqs=default), model_config=llama, gpus=[gpu]) == []
    line = one(refusals(flags(dtype="float16", max_num_seqs=default + 1), model_config=llama, gpus=[gpu]),
               "flags.max_num_seqs")
    said = f"max_num_batched_tokens ({default}) must be greater than or equal to max_num_seqs ({default + 1})"
    assert said in line
    assert line.endswith(f"allowed: max_num_seqs up to {default}, or set max_num_batched_tokens to at least "
                         f"{default + 1}")


def test_scheduler_rules_on_cpu_and_with_explicit_budgets() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    # observed on the 0.32.0 CPU build: "max_num_batched_tokens (2048) must be ... max_num_seqs (4096)"
    one(refusals(flags("cpu", max_num_seqs=4096), accelerator="cpu", model_config=llama),
        "flags.max_num_seqs")
    throughput = flags("cpu", max_num_seqs=4096, extra_args={"performance-mode": "throughput"})
    assert refusals(throughput, accelerator="cpu", model_config=llama) == []
    one(refusals(flags(max_num_batched_tokens=1024, max_num_seqs=2048), model_config=llama),
        "flags.max_num_seqs")
    # max_model_len unset: vLLM's is the model's 131072, more than the budget with chunked prefill off
    line = one(refusals(flags(max_num_batched_tokens=8192, enable_chunked_prefill=False), model_config=llama),
               "flags.max_num_batched_tokens")
    assert "max_num_batched_tokens (8192) is smaller than max_model_len (131072)" in line
    assert refusals(flags(max_num_batched_tokens=8192), model_config=llama) == []  # chunked prefill on
    # 0.33 on: the config says `disable-chunked-prefill: true`, which is the same setting turned off
    off33 = flags(version="0.33.0", max_num_batched_tokens=8192, enable_chunked_prefill=False)
    assert off33.get("disable-chunked-prefill") is True
    one(refusals(off33, version="0.33.0", model_config=llama), "flags.max_num_batched_tokens")
    long = one(refusals(flags(max_model_len=4096, extra_args={"long-prefill-token-threshold": 8192}),
                        model_config=llama), "flags.extra_args.long-prefill-token-threshold")
    assert "long_prefill_token_threshold (8192) cannot be greater than the max_model_len (4096)" in long


# --- block size -------------------------------------------------------------------------------------------
def test_block_size_per_platform() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    line = one(refusals(flags(block_size=8), model_config=llama), "flags.block_size")
    assert "No valid attention backend found for cuda" in line
    assert line.endswith("allowed: 16, 32, 64, 128, 256")
    assert refusals(flags(block_size=16), model_config=llama) == []
    # observed on the 0.32.0 CPU build: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    cpu = one(refusals(flags("cpu", block_size=16), accelerator="cpu", model_config=llama),
              "flags.block_size")
    assert "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])." in cpu
    assert refusals(flags("cpu", block_size=32), accelerator="cpu", model_config=llama) == []
    # vLLM sets 16 itself for MLA models on CPU (a warning, not a refusal)
    assert refusals(flags("cpu", block_size=16), accelerator="cpu",
                    model_config=model("DeepSeek-V2-Lite-Chat")) == []


# --- ports, addresses, executors --------------------------------------------------------------------------
# `ss -ltnp` and the listeners' cgroups as the VllmHost fact printed them on this project's dev machine,
# plus a vllm unit and sshd in the cgroup v2 form systemd writes.
SS_DEV = """\
## unprivileged_port_start
1024
## listen
State  Recv-Q Send-Q Local Address:Port  Peer Address:PortProcess
LISTEN 0      5          127.0.0.1:18555      0.0.0.0:*    users:(("python3",pid=31464,fd=3))
LISTEN 0      128          0.0.0.0:2024       0.0.0.0:*
LISTEN 0      2048         0.0.0.0:8000       0.0.0.0:*    users:(("vllm",pid=378,fd=27))
LISTEN 0      128             [::]:22            [::]:*    users:(("sshd",pid=901,fd=4))
## listen_cgroups
378 0::/system.slice/vllm-default.service
901 0::/system.slice/ssh.service
31464 9:name=systemd:/
"""


def dev_ports(**over: Any) -> HostPorts:
    fact = VllmHost().process(SS_DEV.splitlines())
    fact["interfaces"] = {"10.77.1.2": "host0", "127.0.0.1": "lo"}
    fact.update(over)
    return HostPorts.from_fact(fact)


def test_port_below_the_unprivileged_start_is_refused() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    line = one(refusals(flags(port=443), model_config=llama, ports=dev_ports()), "flags.port")
    assert "[Errno 13] Permission denied" in line and "net.ipv4.ip_unprivileged_port_start is 1024" in line
    assert line.endswith("allowed: 1024-65535, or lower net.ipv4.ip_unprivileged_port_start on the host")
    assert refusals(flags(port=443), model_config=llama, ports=dev_ports(unprivileged_port_start=0)) == []
    old_kernel = one(refusals(flags(port=443), model_config=llama,
                              ports=dev_ports(unprivileged_port_start=None)), "flags.port")
    assert "the kernel has no net.ipv4.ip_unprivileged_port_start" in old_kernel
    assert refusals(flags(port=443), model_config=llama, ports=None) == []  # facts not read: no check


def test_port_held_by_another_service_is_refused() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    line = one(refusals(flags(port=18555), model_config=llama, ports=dev_ports()), "flags.port")
    assert "python3 (pid 31464) on 127.0.0.1:18555" in line and "[Errno 98] Address already in use" in line
    one(refusals(flags(port=18555, host="0.0.0.0"), model_config=llama, ports=dev_ports()), "flags.port")
    assert refusals(flags(port=18555, host="10.77.1.2"), model_config=llama, ports=dev_ports()) == []
    # this toolkit's own unit on 8000: its restart frees the port
    assert refusals(flags(port=8000), model_config=llama, ports=dev_ports()) == []
    # sshd's [::]:22 is IPv6-only (ss prints "*" for a dual-stack socket): no IPv4 clash
    assert refusals(flags(port=2222), model_config=llama, ports=dev_ports()) == []
    # a listener whose process ss could not show (2024) is left alone: it may be one of ours
    assert refusals(flags(port=2024), model_config=llama, ports=dev_ports()) == []


def test_bind_address_must_be_on_the_host() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    line = one(refusals(flags(host="10.77.1.3"), model_config=llama, ports=dev_ports()), "flags.host")
    assert "[Errno 99] Cannot assign requested address" in line
    assert line.endswith("allowed: 127.0.0.1, 0.0.0.0, ::, or one of 10.77.1.2, 127.0.0.1")
    for ok in ("10.77.1.2", "0.0.0.0", "127.0.0.1"):
        assert refusals(flags(host=ok), model_config=llama, ports=dev_ports()) == []


def test_cluster_head_master_port_held_by_another_service() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    head = {**flags(), "nnodes": 2, "node-rank": 0, "master-addr": "10.77.1.2", "master-port": 18555}
    lines = refusals(head, model_config=llama, ports=dev_ports())
    assert len(lines) == 1 and lines[0].startswith(f"{HOST}: vllm.cluster.master_port: 18555 on 10.77.1.2")
    worker = {**head, "node-rank": 1, "headless": True}
    assert refusals(worker, model_config=llama, ports=dev_ports()) == []


def test_executors_that_cannot_start_under_systemd() -> None:
    llama = model("Llama-3.1-8B-Instruct")
    ray = one(refusals(flags(distributed_executor_backend="ray"), model_config=llama),
              "flags.distributed_executor_backend")
    assert "Failed to import Ray" in ray and ray.endswith("allowed: mp, uni, or unset")
    ext = one(refusals(flags(distributed_executor_backend="external_launcher"), model_config=llama),
              "flags.distributed_executor_backend")
    assert "KeyError: 'RANK'" in ext
    env = {"RANK": "0", "LOCAL_RANK": "0"}
    assert refusals(flags(distributed_executor_backend="external_launcher"), model_config=llama,
                    environment=env) == []


def test_listener_helpers() -> None:
    li = Listener("::1", 8000, "nginx", 5, "nginx.service")
    assert li.describe() == "nginx (pid 5, nginx.service) on [::1]:8000" and not li.ours
    assert Listener("0.0.0.0", 8000, "vllm", 6, "vllm-chat.service").ours
