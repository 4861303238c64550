"""plan_host: spec + facts -> HostPlan. GPUs are built literally; the variant table is faked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.gpuselect import choose_dtype
from vllm_fleet.core.hub import HubFile, HubSnapshot
from vllm_fleet.core.layout import model_digest, model_version_dir
from vllm_fleet.core.parallel import choose_tensor_parallel
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.spec import SpecError, parse_host
from vllm_fleet.core.variants import choose_variant as real_choose_variant

HOST = "gpu-07"
KEY = "sk-fleet-test-7c1e0f9a"
ENV = {"VLLM_API_KEY": KEY}
M = {"name": "qwen", "path": "/srv/models/qwen"}


def gpu(i: int, cc: tuple[int, int] = (8, 0), uuid: str | None = None) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-0000-{i}" if uuid is None else uuid, name="NVIDIA A100-SXM4-80GB",
               memory_mib=81920, compute_capability=cc, pci_bus_id=f"00000000:{i + 7:02X}:00.0", minor=i)


def gpus(n: int, cc: tuple[int, int] = (8, 0)) -> tuple[Gpu, ...]:
    return tuple(gpu(i, cc) for i in range(n))


def fake_variant(version: str, accelerator: str, driver: Any, gpu_list: list, override: str | None):
    name = "cpu" if accelerator == "cpu" else "cu130"
    return SimpleNamespace(variant=name, reason="fake", release_dir=f"{version}-{name}",
                           build=SimpleNamespace(index_url=None, extra_index_urls=(), index_strategy=None,
                                                 accelerator="cuda" if name.startswith("cu") else "cpu"))


def plan(data: dict, facts: HostFacts | None = None, environ: dict | None = None,
         configs: dict | None = None, choose_variant: Any = fake_variant,
         model_digests: dict | None = None, hub: dict | None = None) -> HostPlan:
    spec = parse_host(HOST, data)
    return plan_host(HOST, spec, facts if facts is not None else HostFacts(gpus=gpus(1)),
                     ENV if environ is None else environ, configs, choose_variant=choose_variant,
                     model_digests=model_digests, hub=hub)


def refused(*args: Any, **kw: Any) -> list[str]:
    with pytest.raises(SpecError) as e:
        plan(*args, **kw)
    return e.value.problems


def heads(n: int, kv: int | None = None) -> dict[str, dict[str, int]]:
    cfg = {"num_attention_heads": n}
    if kv is not None:
        cfg["num_key_value_heads"] = kv
    return {"default": cfg}


# --- tensor parallel ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "h", "kv", "tp"), [
    (1, 32, 8, 1), (2, 32, 8, 2), (4, 32, 8, 4), (8, 32, 8, 8), (8, 64, 4, 8), (3, 24, None, 3),
])
def test_gpu_count_dividing_heads_is_the_tp(n: int, h: int, kv: int | None, tp: int) -> None:
    p = plan({"model": M}, HostFacts(gpus=gpus(n)), configs=heads(h, kv))
    inst = p.instances[0]
    assert inst.tensor_parallel == tp
    assert inst.flags["tensor-parallel-size"] == tp
    assert len(inst.gpu_indexes) == tp
    assert p.warnings == ()


def test_eight_gpus_twelve_heads_uses_four_with_a_warning() -> None:
    p = plan({"model": M}, HostFacts(gpus=gpus(8)), configs=heads(12))
    inst = p.instances[0]
    assert inst.tensor_parallel == 4
    assert inst.flags["tensor-parallel-size"] == 4
    assert inst.gpu_indexes == (0, 1, 2, 3)
    assert inst.environment["CUDA_VISIBLE_DEVICES"] == "GPU-0000-0,GPU-0000-1,GPU-0000-2,GPU-0000-3"
    assert len(p.warnings) == 1
    w = p.warnings[0]
    assert w.startswith(f"{HOST}: ")
    assert "12 attention heads" in w and "tensor-parallel-size 4" in w and "4 GPU(s) idle" in w


def test_choose_tensor_parallel_directly() -> None:
    assert choose_tensor_parallel(HOST, "a", 8, None, 12, 12) == (4, [
        f"{HOST}: vllm.instances[a]: 8 GPUs do not divide the model's 12 attention heads; using "
        "tensor-parallel-size 4 (4 GPU(s) idle)"])
    tp, warn = choose_tensor_parallel(HOST, "a", 6, None, 40, 8)
    assert tp == 4
    assert len(warn) == 1 and "(2 GPU(s) idle)" in warn[0]
    assert choose_tensor_parallel(HOST, "a", 0, None, 32, 8) == (1, [])
    assert choose_tensor_parallel(HOST, "a", 4, None, None, None) == (4, [])
    assert choose_tensor_parallel(HOST, "a", 8, None, 7, 7)[0] == 1


def test_explicit_tp_not_dividing_heads_refused_with_valid_values() -> None:
    lines = refused({"model": M, "flags": {"tensor_parallel_size": 8}}, HostFacts(gpus=gpus(8)),
                    configs=heads(12))
    assert len(lines) == 1
    assert lines[0].startswith(f"{HOST}: vllm.instances[default].flags.tensor_parallel_size: ")
    assert "12 attention heads" in lines[0]
    assert "[1, 2, 3, 4, 6]" in lines[0]


def test_explicit_tp_dividing_heads_accepted() -> None:
    inst = plan({"model": M, "flags": {"tensor_parallel_size": 2}}, HostFacts(gpus=gpus(2)),
                configs=heads(12)).instances[0]
    assert inst.tensor_parallel == 2
    assert inst.gpu_indexes == (0, 1)


def test_kv_heads_rule() -> None:
    # 48 heads divide by 4, but 6 KV heads neither divide by 4 nor divide 4: vLLM refuses tp 4.
    p = plan({"model": M}, HostFacts(gpus=gpus(4)), configs=heads(48, 6))
    assert p.instances[0].tensor_parallel == 2
    assert len(p.warnings) == 1
    # tp a multiple of the KV heads replicates them: fine.
    assert plan({"model": M}, HostFacts(gpus=gpus(8)), configs=heads(32, 4)).instances[0].tensor_parallel == 8
    lines = refused({"model": M, "flags": {"tensor_parallel_size": 4}}, HostFacts(gpus=gpus(4)),
                    configs=heads(48, 6))
    assert "tensor_parallel_size" in lines[0]
    assert "6 KV heads" in lines[0]
    assert "[1, 2, 3]" in lines[0]


def test_explicit_tp_more_than_gpus_refused() -> None:
    lines = refused({"model": M, "gpus": 2, "flags": {"tensor_parallel_size": 4}}, HostFacts(gpus=gpus(4)))
    assert lines == [f"{HOST}: vllm.instances[default].flags.tensor_parallel_size: 4 is more than the "
                     "2 GPU(s) given to the instance"]


def test_explicit_tp_below_gpu_count_warns_and_frees_the_rest() -> None:
    p = plan({"instances": [{"name": "a", "model": M, "flags": {"tensor_parallel_size": 2}},
                            {"name": "b", "model": M, "gpus": 2, "flags": {"port": 8001}}]},
             HostFacts(gpus=gpus(8)))
    assert [i.gpu_indexes for i in p.instances] == [(0, 1), (2, 3)]


def test_pipeline_parallel_shares_the_gpus() -> None:
    inst = plan({"model": M, "flags": {"pipeline_parallel_size": 2}}, HostFacts(gpus=gpus(4)),
                configs=heads(32, 8)).instances[0]
    assert inst.tensor_parallel == 2
    assert inst.gpu_indexes == (0, 1, 2, 3)


# --- dtype ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("ccs", "dtype"), [
    ([(8, 0)], "bfloat16"), ([(9, 0), (9, 0)], "bfloat16"), ([(12, 0)], "bfloat16"), ([(8, 6)], "bfloat16"),
    ([(7, 5)], "float16"), ([(7, 0)], "float16"), ([(8, 0), (7, 5)], "float16"),
    ([(8, 9), (7, 5)], "float16"),
])
def test_dtype_from_compute_capability(ccs: list[tuple[int, int]], dtype: str) -> None:
    assert choose_dtype("cuda", [gpu(i, cc) for i, cc in enumerate(ccs)], frozenset()) == dtype


@pytest.mark.parametrize(("flags", "dtype"), [
    ({"avx512_bf16", "avx512f"}, "bfloat16"), ({"amx_bf16"}, "bfloat16"), ({"sse4_2", "ssse3"}, "float32"),
])
def test_dtype_on_cpu(flags: set[str], dtype: str) -> None:
    assert choose_dtype("cpu", [], frozenset(flags)) == dtype


def test_plan_dtype_in_flags_and_explicit_dtype_wins() -> None:
    assert plan({"model": M}, HostFacts(gpus=(gpu(0, (7, 5)),))).instances[0].flags["dtype"] == "float16"
    assert plan({"model": M}, HostFacts(gpus=(gpu(0, (9, 0)),))).instances[0].flags["dtype"] == "bfloat16"
    inst = plan({"model": M, "flags": {"dtype": "float32"}}, HostFacts(gpus=(gpu(0, (9, 0)),))).instances[0]
    assert (inst.dtype, inst.flags["dtype"]) == ("float32", "float32")


def test_dtype_uses_only_the_instance_gpus() -> None:
    facts = HostFacts(gpus=(gpu(0, (9, 0)), gpu(1, (7, 5))))
    p = plan({"instances": [{"name": "new", "model": M, "gpus": [0]},
                            {"name": "old", "model": M, "gpus": [1], "flags": {"port": 8001}}]}, facts)
    assert [i.dtype for i in p.instances] == ["bfloat16", "float16"]


# --- GPU assignment -------------------------------------------------------------------------------------
def two(a: Any, b: Any) -> dict:
    return {"instances": [{"name": "a", "model": M, "gpus": a},
                          {"name": "b", "model": M, "gpus": b, "flags": {"port": 8001}}]}


def test_counts_take_the_next_free_gpus() -> None:
    p = plan(two(2, 2), HostFacts(gpus=gpus(4)))
    assert [i.gpu_indexes for i in p.instances] == [(0, 1), (2, 3)]
    assert [i.environment["CUDA_VISIBLE_DEVICES"] for i in p.instances] == [
        "GPU-0000-0,GPU-0000-1", "GPU-0000-2,GPU-0000-3"]
    assert [i.port for i in p.instances] == [8000, 8001]
    assert [i.unit for i in p.instances] == ["vllm-a.service", "vllm-b.service"]


def test_explicit_indexes() -> None:
    p = plan(two([3], [0, 1]), HostFacts(gpus=gpus(4)))
    assert [i.gpu_indexes for i in p.instances] == [(3,), (0, 1)]
    assert p.instances[0].environment["CUDA_VISIBLE_DEVICES"] == "GPU-0000-3"


def test_explicit_then_count_skips_taken() -> None:
    p = plan(two([0], 2), HostFacts(gpus=gpus(4)))
    assert [i.gpu_indexes for i in p.instances] == [(0,), (1, 2)]


def test_overlap_refused() -> None:
    lines = refused(two([0, 1], [1, 2]), HostFacts(gpus=gpus(4)))
    assert lines == [f"{HOST}: vllm.instances[b].gpus: GPU [1] already given to another instance"]


def test_unknown_index_refused() -> None:
    lines = refused({"model": M, "gpus": [7]}, HostFacts(gpus=gpus(4)))
    assert lines == [f"{HOST}: vllm.instances[default].gpus: GPU index [7] not on this host "
                     "(has [0, 1, 2, 3])"]


def test_count_larger_than_free_refused() -> None:
    lines = refused(two(3, 2), HostFacts(gpus=gpus(4)))
    assert lines == [f"{HOST}: vllm.instances[b].gpus: asks for 2 GPU(s), the host has 1 free of 4"]


def test_all_gpus_then_nothing_left() -> None:
    lines = refused(two(None, None), HostFacts(gpus=gpus(2)))
    assert lines == [f"{HOST}: vllm.instances[b].gpus: no GPU left for this instance"]


def test_visible_devices_fall_back_to_indexes_without_uuid() -> None:
    facts = HostFacts(gpus=(gpu(0, uuid=""), gpu(1, uuid="")))
    assert plan({"model": M}, facts).instances[0].environment["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_env_cannot_override_planned_gpu_assignment() -> None:
    with pytest.raises(SpecError):
        plan({"model": M, "gpus": [1], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, HostFacts(gpus=gpus(2)))


# --- secrets --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("environ", [{}, {"VLLM_API_KEY": ""}])
def test_missing_or_empty_api_key_refused_by_name(environ: dict) -> None:
    lines = refused({"model": M}, environ=environ)
    assert len(lines) == 1
    assert lines[0].startswith(f"{HOST}: vllm.instances[default]")
    assert "VLLM_API_KEY is not set (or empty)" in lines[0]


def test_custom_key_variables_named_and_mapped() -> None:
    data = {"model": M, "api_key_env": "FLEET_PROD_KEY", "hf_token_env": "FLEET_HF"}
    lines = refused(data, environ={"VLLM_API_KEY": KEY})
    # the HF token is asked for only where a hub model is fetched; here it is said to be unused
    assert len(lines) == 1
    assert "FLEET_PROD_KEY" in lines[0] and "VLLM_API_KEY on the host" in lines[0]
    hub_data = {**data, "model": {"name": "q", "hf_repo": "Qwen/Qwen3-8B"}}
    lines = refused(hub_data, environ={"FLEET_PROD_KEY": KEY}, hub={"default": snapshot()})
    assert len(lines) == 1 and "FLEET_HF" in lines[0] and "the hub fetch's token" in lines[0]
    p = plan(data, environ={"FLEET_PROD_KEY": KEY, "FLEET_HF": "hf_tok_5d4c3b2a"})
    assert p.warnings == ("gpu-07: vllm.instances[default].hf_token_env: FLEET_HF is not used: the model is "
                          "not from a hub (hf_repo)",)
    inst = p.instances[0]
    # the HF token is a hub fetch's, never vLLM's: not in the unit's env file, and no fetch here
    assert inst.secret_env == {"VLLM_API_KEY": "FLEET_PROD_KEY"}
    assert inst.hub_token_env is None
    assert inst.api_key_required is True


def test_secret_values_never_in_the_plan() -> None:
    environ = {"FLEET_PROD_KEY": KEY, "FLEET_HF": "hf_tok_5d4c3b2a"}
    data = {"instances": [{"name": "a", "model": M, "gpus": 1, "api_key_env": "FLEET_PROD_KEY",
                           "hf_token_env": "FLEET_HF"},
                          {"name": "b", "model": M, "gpus": 1, "api_key_env": "FLEET_PROD_KEY",
                           "flags": {"port": 8001}}]}
    p = plan(data, HostFacts(gpus=gpus(2)), environ=environ)
    text = repr(p)
    assert KEY not in text
    assert "hf_tok_5d4c3b2a" not in text
    assert "FLEET_PROD_KEY" in text  # the names are there, the values are not


def test_every_missing_secret_of_every_instance_reported() -> None:
    data = {"instances": [{"name": "a", "model": M, "api_key_env": "KEY_A"},
                          {"name": "b", "model": M, "api_key_env": "KEY_B", "flags": {"port": 8001}}]}
    lines = refused(data, HostFacts(gpus=gpus(2)), environ={})
    assert len(lines) == 2
    assert "instances[a]" in lines[0] and "KEY_A" in lines[0]
    assert "instances[b]" in lines[1] and "KEY_B" in lines[1]


# --- network exposure -----------------------------------------------------------------------------------
def test_non_loopback_with_a_key_accepted() -> None:
    inst = plan({"model": M, "flags": {"host": "0.0.0.0"}}).instances[0]
    assert inst.host == "0.0.0.0"
    assert inst.flags["host"] == "0.0.0.0"
    assert inst.api_key_required is True


@pytest.mark.parametrize("addr", ["0.0.0.0", "10.1.2.3", "::", "gpu-07.lan"])
def test_non_loopback_without_key_refused(addr: str) -> None:
    lines = refused({"model": M, "api_key_env": None, "flags": {"host": addr}}, environ={})
    assert len(lines) == 1
    assert lines[0].startswith(f"{HOST}: vllm.instances[default].flags.host: {addr} ")
    assert "no API key" in lines[0] and "port_protected_elsewhere" in lines[0]


def test_non_loopback_without_key_accepted_when_protected_elsewhere() -> None:
    inst = plan({"model": M, "api_key_env": None, "port_protected_elsewhere": True,
                 "flags": {"host": "0.0.0.0"}}, environ={}).instances[0]
    assert inst.secret_env == {}
    assert inst.api_key_required is False


@pytest.mark.parametrize("addr", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_without_key_accepted(addr: str) -> None:
    inst = plan({"model": M, "api_key_env": None, "flags": {"host": addr}}, environ={}).instances[0]
    assert inst.secret_env == {}
    assert inst.api_key_required is False


# --- platform-specific flags and environment ------------------------------------------------------------
def test_cuda_host_flags_and_environment() -> None:
    p = plan({"model": M}, HostFacts(gpus=gpus(2)), configs=heads(32, 8))
    inst = p.instances[0]
    assert inst.flags == {
        "model": model_version_dir("qwen", model_digest([("path", "/srv/models/qwen")])),
        "served-model-name": "qwen",
        "dtype": "bfloat16",
        "no-trust-remote-code": True,
        "gpu-memory-utilization": 0.9,
        "max-num-seqs": 256,
        "block-size": 16,
        "tensor-parallel-size": 2,
        "pipeline-parallel-size": 1,
        "no-enforce-eager": True,
        "host": "127.0.0.1",
        "port": 8000,
        "shutdown-timeout": 30,
        "middleware": "vllm_fleet_keyguard.KeyGuard",
    }
    assert inst.environment == {
        "HOME": "/var/lib/vllm",
        "HF_HOME": "/var/lib/vllm/hf",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "GPU-0000-0,GPU-0000-1",
        "PYTHONPATH": "/usr/local/lib/vllm-fleet/asgi",
        "VLLM_FLEET_OPEN_PATHS": "/health",
    }
    assert (inst.config_path, inst.env_path, inst.unit) == (
        "/etc/vllm/default.yaml", "/etc/vllm/default.env", "vllm-default.service")
    assert (inst.model_dir, inst.stage_from, inst.served_name) == (
        inst.flags["model"], "/srv/models/qwen", "qwen")
    assert inst.shutdown_timeout == 30
    assert (p.variant, p.release, p.release_dir) == (
        "cu130", "0.32.0-cu130", "/opt/vllm/releases/0.32.0-cu130")


def test_a_staged_model_lives_in_a_directory_named_by_its_content() -> None:
    """Versions side by side under root's /opt/vllm/models: a change of weights gets a new directory,
    so the config a rollback restores still names the old weights, unchanged."""
    one = [("config.json", "a" * 64), ("model.safetensors", "b" * 64)]
    two = [("config.json", "a" * 64), ("model.safetensors", "c" * 64)]
    assert model_digest(one) == model_digest(list(reversed(one))) != model_digest(two)
    d1, d2 = (plan({"model": M}, HostFacts(gpus=gpus(1)), configs=heads(32, 8),
                   model_digests={"default": model_digest(f)}).instances[0] for f in (one, two))
    assert d1.model_dir == f"/opt/vllm/models/qwen/{model_digest(one)}" == d1.flags["model"]
    assert d2.model_dir == f"/opt/vllm/models/qwen/{model_digest(two)}"
    with pytest.raises(SpecError, match=r"gpu-07: vllm.instances\[default\].model.path: no content digest"):
        plan({"model": M}, HostFacts(gpus=gpus(1)), configs=heads(32, 8), model_digests={})


def test_explicit_block_size_kept_on_cuda() -> None:
    assert plan({"model": M, "flags": {"block_size": 32}}).instances[0].flags["block-size"] == 32


def test_cpu_host_gets_kv_cache_space_and_no_gpu_flags() -> None:
    facts = HostFacts(cpu_flags=frozenset({"avx512f", "avx512_bf16"}))
    p = plan({"model": M, "accelerator": "cpu", "cpu_kvcache_gib": 8}, facts)
    inst = p.instances[0]
    assert inst.environment["VLLM_CPU_KVCACHE_SPACE"] == "8"
    assert "CUDA_VISIBLE_DEVICES" not in inst.environment
    for absent in ("tensor-parallel-size", "gpu-memory-utilization", "block-size"):
        assert absent not in inst.flags
    assert inst.flags["dtype"] == "bfloat16"
    assert inst.gpu_indexes == ()
    assert inst.tensor_parallel == 1
    assert p.variant == "cpu"


def test_cpu_host_ignores_gpu_facts_default_kv_space() -> None:
    p = plan({"model": M, "accelerator": "cpu"}, HostFacts(gpus=gpus(2)))
    assert p.instances[0].environment["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert p.instances[0].gpu_indexes == ()


SHA = "0123456789abcdef0123456789abcdef01234567"


def snapshot(config: dict | None = None, **kw: Any) -> HubSnapshot:
    files = (HubFile("config.json", 700), HubFile("model.safetensors", 16 * 2**30, "ab" * 32))
    return HubSnapshot(**{"repo": "Qwen/Qwen3-8B", "revision": "v1.0", "sha": SHA,
                          "endpoint": "https://hub.example", "files": files,
                          "config": config if config is not None else heads(32, 8)["default"], **kw})


def test_hf_repo_model_serves_the_fetched_commit_offline() -> None:
    data = {"model": {"name": "qwen3", "hf_repo": "Qwen/Qwen3-8B", "revision": "v1.0"},
            "hf_token_env": "HF_TOKEN"}
    inst = plan(data, environ={**ENV, "HF_TOKEN": "hf_x"}, hub={"default": snapshot()}).instances[0]
    assert inst.flags["model"] == f"/var/lib/vllm/hf/hub/models--Qwen--Qwen3-8B/snapshots/{SHA}"
    assert inst.flags["served-model-name"] == "qwen3"
    assert "revision" not in inst.flags  # the directory is the commit
    assert inst.stage_from is None
    assert inst.environment["HF_HUB_OFFLINE"] == "1"
    assert (inst.hub_token_env, inst.hub_token_path) == ("HF_TOKEN", "/etc/vllm/default.hub.env")
    assert "HF_TOKEN" not in inst.secret_env


def test_hf_repo_model_is_checked_from_the_commits_config() -> None:
    data = {"model": {"name": "q", "hf_repo": "Qwen/Qwen3-8B"}, "gpus": 4,
            "flags": {"tensor_parallel_size": 4}}
    problems = refused(data, HostFacts(gpus=gpus(4)), hub={"default": snapshot({"num_attention_heads": 6})})
    assert any("tensor_parallel_size" in p and "6" in p for p in problems), problems


def test_hf_repo_model_without_a_resolved_commit_is_refused() -> None:
    problems = refused({"model": {"name": "q", "hf_repo": "Qwen/Qwen3-8B"}})
    assert problems == [f"{HOST}: vllm.instances[default].model.hf_repo: Qwen/Qwen3-8B was not resolved to a "
                        "commit (the controller reads the hub at plan time)"]


def test_host_path_model_used_in_place() -> None:
    inst = plan({"model": {"name": "q", "host_path": "/data/q"}, "flags": {"served_model_name": "q-v2"}}
                ).instances[0]
    assert (inst.flags["model"], inst.stage_from, inst.served_name) == ("/data/q", None, "q-v2")
    assert inst.environment["HF_HUB_OFFLINE"] == "1"


def test_shutdown_timeout_carried() -> None:
    inst = plan({"model": M, "flags": {"shutdown_timeout": 120}}).instances[0]
    assert inst.shutdown_timeout == 120
    assert inst.flags["shutdown-timeout"] == 120


# --- facts and variants ---------------------------------------------------------------------------------
def test_blocking_nvidia_problem_refuses_a_cuda_host() -> None:
    from vllm_fleet.core.gpus import NvidiaProblem

    lines = refused({"model": M}, HostFacts(nvidia_problem=NvidiaProblem("no_driver")))
    assert len(lines) == 1
    assert lines[0].startswith(f"{HOST}: nvidia-smi is not installed")


def test_nvidia_problem_ignored_on_cpu_host() -> None:
    from vllm_fleet.core.gpus import NvidiaProblem

    p = plan({"model": M, "accelerator": "cpu"}, HostFacts(nvidia_problem=NvidiaProblem("no_driver")))
    assert p.variant == "cpu"


def test_variant_refusal_named_as_vllm_variant() -> None:
    def refuse(*_: Any) -> Any:
        raise ValueError("no CUDA build fits: install NVIDIA driver >= 580.65.06 (cu130)")

    lines = refused({"model": M}, choose_variant=refuse)
    assert lines == [f"{HOST}: vllm.variant: no CUDA build fits: install NVIDIA driver >= 580.65.06 (cu130)"]


def test_variant_chooser_gets_the_spec_and_facts() -> None:
    seen: list[tuple] = []

    def spy(version: str, accelerator: str, driver: Any, gpu_list: list, override: str | None) -> Any:
        seen.append((version, accelerator, driver, tuple(gpu_list), override))
        return fake_variant(version, accelerator, driver, gpu_list, override)

    facts = HostFacts(gpus=gpus(2), driver="580.95.05")
    plan({"model": M, "version": "0.33.0", "variant": "cu129"}, facts, choose_variant=spy)
    assert seen == [("0.33.0", "cuda", "580.95.05", gpus(2), "cu129")]


def test_variant_chosen_for_the_gpus_the_instances_use() -> None:
    seen: list[tuple[int, ...]] = []

    def spy(version: str, accelerator: str, driver: Any, gpu_list: list, override: str | None) -> Any:
        seen.append(tuple(g.index for g in gpu_list))
        return fake_variant(version, accelerator, driver, gpu_list, override)

    plan({"model": M, "gpus": [1, 2]}, HostFacts(gpus=gpus(4)), choose_variant=spy)
    assert seen == [(0, 1, 2, 3), (1, 2)]


def test_loaded_driver_without_nvidia_smi_refused_naming_the_package() -> None:
    from vllm_fleet.core.gpus import NO_NVIDIA_SMI, NvidiaProblem

    lines = refused({"model": M}, HostFacts(nvidia_problem=NvidiaProblem(NO_NVIDIA_SMI, "525.60.11")))
    assert len(lines) == 1
    assert lines[0].startswith(
        f"{HOST}: the NVIDIA driver 525.60.11 is loaded (/proc/driver/nvidia/version) but nvidia-smi is not "
        "installed/not on PATH: install the driver's utilities package (nvidia-utils-525 on Ubuntu, "
        "nvidia-smi on Debian)")


def test_messages_name_instances_by_their_field_path() -> None:
    """Every planner warning or refusal about an instance names it as vllm.instances[<name>]."""
    lines = list(plan({"model": M}, HostFacts(gpus=gpus(8)), configs=heads(12)).warnings)
    lines += plan({"instances": [{"name": "a", "model": M, "gpus": 4,
                                  "flags": {"tensor_parallel_size": 2}}]}, HostFacts(gpus=gpus(4))).warnings
    lines += refused(two(3, 2), HostFacts(gpus=gpus(4)))
    lines += refused({"model": M, "flags": {"tensor_parallel_size": 8}}, HostFacts(gpus=gpus(8)),
                     configs=heads(12))
    assert len(lines) == 4
    for line in lines:
        assert line.startswith(f"{HOST}: vllm.instances["), line
        assert " instance a:" not in line and " instance default:" not in line


def test_a_token_sent_over_plain_http_is_warned_about_unless_to_loopback() -> None:
    data = {"model": {"name": "q", "hf_repo": "Qwen/Qwen3-8B"}, "hf_token_env": "T"}
    env = {**ENV, "T": "hf_x"}
    warned = plan(data, environ=env, hub={"default": snapshot(endpoint="http://10.0.0.5:8080")}).warnings
    assert warned == ("gpu-07: vllm.instances[default].hf_token_env: the token goes to http://10.0.0.5:8080 "
                      "over plain http, readable on the network; use https",)
    assert plan(data, environ=env, hub={"default": snapshot(endpoint="http://127.0.0.1:8080")}).warnings == ()


def test_a_registry_host_is_refused_a_lock_resolved_from_the_controllers_own_folders():
    """VLLM_FLEET_FIND_LINKS feeds CPU builds' locks (torch's CPU build is on no PyPI): a registry host
    could not fetch those files, so the plan refuses before the build would fail on the host."""
    env = {**ENV, "VLLM_FLEET_FIND_LINKS": "/opt/wheels"}
    cpu = {"model": M, "accelerator": "cpu", "install_source": "registry"}
    with pytest.raises(SpecError, match="registry host installs from the index.*/opt/wheels"):
        plan(cpu, HostFacts(), environ=env, choose_variant=real_choose_variant)
    assert plan({**cpu, "install_source": "cache"}, HostFacts(), environ=env,
                choose_variant=real_choose_variant).index.find_links == ("/opt/wheels",)
    # a CUDA build never takes them (a find-links torch+cpu satisfies torch==X)
    assert plan({"model": M, "install_source": "registry"}, environ=env).index.find_links == ()


@pytest.mark.parametrize("url", ["https://user:token@pypi.internal/simple", "https://pypi.internal/s@x"])
def test_an_index_url_with_credentials_is_refused(url):
    with pytest.raises(SpecError, match="package_index.index_url"):
        parse_host(HOST, {"model": M, "package_index": {"index_url": url}})


def test_uni_executor_with_more_than_one_rank_is_refused() -> None:
    """vLLM's uni executor runs one worker; with TP or PP above 1 it hangs at start-up waiting for ranks
    that never start. Caught by the plan, on a host of its own (nodes of a group refuse it already)."""
    lines = refused({"model": M, "flags": {"distributed_executor_backend": "uni"}},
                    facts=HostFacts(gpus=gpus(2)))
    assert lines[0].startswith("gpu-07: vllm.instances[default].flags.distributed_executor_backend: 'uni' "
                               "runs a single worker, but this instance runs tensor 2 x pipeline 1")
    ok = plan({"model": M, "flags": {"distributed_executor_backend": "uni", "tensor_parallel_size": 1}},
              facts=HostFacts(gpus=gpus(2)))
    assert ok.instances[0].tensor_parallel == 1
