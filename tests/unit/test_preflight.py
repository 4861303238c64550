"""The memory preflight as the planner applies it: an instance that would OOM is refused on the controller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.gpus import DriverVersion, Gpu
from fleet.plan import HostFacts, plan_host
from fleet.spec import SpecError, parse_host

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
ENV = {"VLLM_API_KEY": "k"}


def cfg(name: str) -> tuple[dict, int]:
    data = json.loads((CONFIGS / f"{name}.json").read_text())
    return data, data["_weight_bytes"]


def h100(n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, (9, 0), f"00000000:{i:02X}:00.0")
                 for i in range(n))


def plan(data: dict, gpus: tuple[Gpu, ...], model: str):
    config, weights = cfg(model)
    spec = parse_host("gpu-01", {"model": {"name": "m", "path": "/srv/m"}, **data})
    facts = HostFacts(gpus=gpus, driver=DriverVersion.parse("580.105.08"))
    return plan_host("gpu-01", spec, facts, ENV, {"default": config}, weight_bytes={"default": weights})


def test_70b_on_one_h100_is_refused_with_the_way_out():
    with pytest.raises(SpecError) as e:
        plan({"gpus": 1, "flags": {"max_model_len": 8192}}, h100(1), "Llama-3.1-70B-Instruct")
    line = e.value.problems[0]
    assert line.startswith("gpu-01: instance default: needs ")
    assert "tensor_parallel_size 2" in line


def test_70b_over_two_h100_fits():
    p = plan({"flags": {"max_model_len": 8192}}, h100(2), "Llama-3.1-70B-Instruct")
    assert p.instances[0].tensor_parallel == 2


def test_cpu_context_larger_than_the_kv_space_is_refused():
    tiny = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
            "vocab_size": 734, "max_position_embeddings": 2048, "torch_dtype": "float32",
            "intermediate_size": 256}
    # 512 bytes per token (2 layers x 2 KV heads x 32 x 2 x bf16): 1 GiB holds 2,097,152 tokens
    spec = parse_host("lab1", {"accelerator": "cpu", "model": {"name": "t", "path": "/x"},
                               "flags": {"max_model_len": 4_194_304}})
    with pytest.raises(SpecError, match=r"lab1: instance default: one 4194304-token sequence needs 2.00 GiB"):
        plan_host("lab1", spec, HostFacts(), ENV, {"default": tiny}, weight_bytes={"default": 1_936_032})
