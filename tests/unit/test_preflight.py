"""The memory preflight as the planner applies it: an instance that would OOM is refused on the controller,
and its ways out are only what this host and model allow.

Hosts are real captures (tests/fixtures/nvidia, INDEX.md): their driver and GPUs parsed by
vllm_fleet.core.gpus, the
variant chosen from the real table. Models are the published configs of tests/fixtures/model_configs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.nvidia_captures import capture
from vllm_fleet.core.gpus import DriverVersion, Gpu, parse_smi_table
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.spec import SpecError, parse_host

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
ENV = {"VLLM_API_KEY": "k"}
H100_X1 = "smi_table/h100-80gb-hbm3-x1-580.105.08-cuda13.0.txt"  # 81559 MiB = 79.6 GiB
H100_X4 = "smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt"
A10G_X1 = "smi_table/a10g-x1-535.247.01-cuda12.2-TRUNC.txt"  # 23028 MiB


def cfg(name: str) -> tuple[dict, int]:
    data = json.loads((CONFIGS / f"{name}.json").read_text())
    return data, data["_weight_bytes"]


def host(fixture: str) -> HostFacts:
    table = parse_smi_table(capture(fixture))
    # the table shows no device minor; these tests are not about device nodes
    return HostFacts(gpus=tuple(replace(g.to_gpu(), minor=g.index) for g in table.gpus), driver=table.driver)


def h100(n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, (9, 0), f"00000000:{i:02X}:00.0", minor=i)
                 for i in range(n))


def plan(data: dict, facts: HostFacts | tuple[Gpu, ...], model: str | tuple[dict, int]) -> HostPlan:
    config, weights = cfg(model) if isinstance(model, str) else model
    if not isinstance(facts, HostFacts):
        facts = HostFacts(gpus=facts, driver=DriverVersion.parse("580.105.08"))
    spec = parse_host("gpu-01", {"model": {"name": "m", "path": "/srv/m"}, **data})
    return plan_host("gpu-01", spec, facts, ENV, {"default": config}, weight_bytes={"default": weights})


def refusal(*args: object) -> str:
    with pytest.raises(SpecError) as e:
        plan(*args)  # type: ignore[arg-type]
    assert len(e.value.problems) == 1
    return e.value.problems[0]


def test_70b_on_one_h100_says_more_gpus_not_a_tp_the_host_lacks() -> None:
    """Llama-3.1-70B at 8192 tokens needs TP 2 (vllm_fleet/core/sizing.py: 70.2 of 71.7 GiB); the one-GPU
    host of the
    capture cannot give that, so the advice is another host, never `tensor_parallel_size 2`."""
    line = refusal({"flags": {"max_model_len": 8192}}, host(H100_X1), "Llama-3.1-70B-Instruct")
    assert line.startswith("gpu-01: vllm.instances[default]: needs ")
    assert line.endswith("; ways out: more GPUs than this instance has (1): tensor_parallel_size 2 over 2 "
                         "GPUs, so a host with 2 GPUs of 79.6 GiB (this one has 1)")


def test_70b_given_one_of_four_h100_is_told_to_take_two() -> None:
    """The 4x H100 capture: with `gpus: 1` the instance cannot take TP 2, but the host has the GPUs."""
    line = refusal({"gpus": 1, "flags": {"max_model_len": 8192}}, host(H100_X4), "Llama-3.1-70B-Instruct")
    assert line.endswith("; ways out: more GPUs than this instance has (1): tensor_parallel_size 2 over 2 "
                         "GPUs (gpus: 2; this host has 4)")
    assert plan({"gpus": 2, "flags": {"max_model_len": 8192}}, host(H100_X4),
                "Llama-3.1-70B-Instruct").instances[0].tensor_parallel == 2


def test_tp_way_out_within_the_instance_gpus_is_one_the_planner_accepts() -> None:
    """An explicit TP 1 on the 4x H100 capture: TP 2 is within the instance's GPUs, so it is offered as
    is, and planning with it passes."""
    data = {"flags": {"max_model_len": 8192, "tensor_parallel_size": 1}}
    line = refusal(data, host(H100_X4), "Llama-3.1-70B-Instruct")
    assert line.endswith("; ways out: tensor_parallel_size 2")
    fixed = {"flags": {"max_model_len": 8192, "tensor_parallel_size": 2}}
    assert plan(fixed, host(H100_X4), "Llama-3.1-70B-Instruct").instances[0].tensor_parallel == 2


def test_70b_over_two_h100_fits() -> None:
    p = plan({"flags": {"max_model_len": 8192}}, h100(2), "Llama-3.1-70B-Instruct")
    assert p.instances[0].tensor_parallel == 2


def test_context_way_out_never_above_the_model_limit() -> None:
    """Llama-3.1-8B (limit 131072) asked for 1,048,576 tokens on the H100 capture: the KV room would hold
    446,304 tokens, but the length offered is the model's own limit."""
    line = refusal({"flags": {"max_model_len": 1_048_576, "max_num_seqs": 1}}, host(H100_X1),
                   "Llama-3.1-8B-Instruct")
    assert "ways out: max_model_len <= 131072 (the model's limit)" in line


def test_default_context_includes_rope_scaling() -> None:
    """Qwen2.5-7B-Instruct on the A10G capture. vLLM 0.31-0.33 do not scale YaRN's max_position_embeddings
    again, so the model card's long-text block leaves the default at 32768, which fits; asking for 4 x that
    is refused, with ways out within the model's limit."""
    config, weights = cfg("Qwen2.5-7B-Instruct")
    assert plan({}, host(A10G_X1), (config, weights)).instances[0].flags.get("max-model-len") is None
    yarn = {**config, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                                       "type": "yarn"}}
    assert plan({}, host(A10G_X1), (yarn, weights)).instances[0].flags.get("max-model-len") is None
    line = refusal({"flags": {"max_model_len": 32768 * 4}}, host(A10G_X1), (yarn, weights))
    assert "131072" in line and "ways out: max_model_len <= " in line


def test_cpu_context_larger_than_the_kv_space_is_refused() -> None:
    tiny = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
            "vocab_size": 734, "max_position_embeddings": 2048, "torch_dtype": "float32",
            "intermediate_size": 256}
    # 512 bytes per token (2 layers x 2 KV heads x 32 x 2 x bf16): 1 GiB holds 2,097,152 tokens
    spec = parse_host("lab1", {"accelerator": "cpu", "model": {"name": "t", "path": "/x"},
                               "flags": {"max_model_len": 4_194_304}})
    with pytest.raises(SpecError, match=r"lab1: vllm.instances\[default\]: one 4194304-token sequence needs "
                                        r"2.00 GiB.*max_model_len <= 2048 \(the model's limit\)$"):
        plan_host("lab1", spec, HostFacts(), ENV, {"default": tiny}, weight_bytes={"default": 1_936_032})
