"""ServeFlags: seed defaults, refusals with useful messages, and render_flags' version/platform filter."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from vllm_fleet.core.flags import ServeFlags, accepted_by, render_flags, version_tuple

FAST = settings(max_examples=30, deadline=None)


def refusal(data: dict) -> str:
    with pytest.raises(ValidationError) as e:
        ServeFlags.model_validate(data)
    return str(e.value)


def messages(data: dict) -> list[str]:
    with pytest.raises(ValidationError) as e:
        ServeFlags.model_validate(data)
    return [err["msg"] for err in e.value.errors()]


# --- seed defaults --------------------------------------------------------------------------------------
def test_seed_defaults() -> None:
    f = ServeFlags()
    assert f.gpu_memory_utilization == 0.90
    assert f.max_num_seqs == 256
    assert f.host == "127.0.0.1"
    assert f.port == 8000
    assert f.trust_remote_code is False
    assert f.enforce_eager is False
    assert f.pipeline_parallel_size == 1
    # derived by the planner (block-size 16 on CUDA, TP from the GPUs, dtype from compute capability)
    assert f.block_size is None
    assert f.tensor_parallel_size is None
    assert f.dtype is None
    # left to vLLM's V1 defaults (both on)
    assert f.enable_prefix_caching is None
    assert f.enable_chunked_prefill is None
    assert f.max_model_len is None
    assert f.max_num_batched_tokens is None
    # in-flight requests finish on a restart (vLLM's own 0 aborts them): issue 21
    assert f.shutdown_timeout == 30
    assert f.extra_args == {}


def test_default_render_cuda_is_exactly_the_seed_values_in_stable_order() -> None:
    out = render_flags(ServeFlags(), "0.32.0", "cuda")
    assert list(out.items()) == [
        ("no-trust-remote-code", True),  # "off" as vLLM's loader honours it
        ("gpu-memory-utilization", 0.9),
        ("max-num-seqs", 256),
        ("pipeline-parallel-size", 1),
        ("no-enforce-eager", True),
        ("host", "127.0.0.1"),
        ("port", 8000),
        ("shutdown-timeout", 30),  # in-flight requests finish on a restart (issue 21)
    ]


def test_default_render_cpu_has_no_gpu_memory_utilization() -> None:
    out = render_flags(ServeFlags(gpu_memory_utilization=0.5), "0.32.0", "cpu")
    assert "gpu-memory-utilization" not in out
    assert out == {
        "no-trust-remote-code": True,
        "max-num-seqs": 256,
        "pipeline-parallel-size": 1,
        "no-enforce-eager": True,
        "host": "127.0.0.1",
        "port": 8000,
        "shutdown-timeout": 30,
    }


def test_render_drops_flags_older_versions_lack() -> None:
    f = ServeFlags(shutdown_timeout=45)
    assert "shutdown-timeout" not in render_flags(f, "0.10.2", "cuda")
    assert render_flags(f, "0.11.0", "cuda")["shutdown-timeout"] == 45
    assert render_flags(f, "0.32.0", "cpu")["shutdown-timeout"] == 45


def test_accepted_by_and_version_tuple() -> None:
    assert version_tuple("0.32.0+cpu") == (0, 32, 0)
    assert version_tuple("0.32.0.post1") == (0, 32, 0)
    assert version_tuple("0.9.2") < version_tuple("0.10.0")
    assert accepted_by("shutdown_timeout", "0.10.9", "cuda") is False
    assert accepted_by("shutdown_timeout", "0.11.0", "cuda") is True
    assert accepted_by("gpu_memory_utilization", "0.32.0", "cpu") is False
    assert accepted_by("gpu_memory_utilization", "0.32.0", "cuda") is True
    assert accepted_by("max_num_seqs", "0.32.0", "rocm") is False


def test_render_keeps_booleans_and_set_values() -> None:
    f = ServeFlags(enforce_eager=True, trust_remote_code=True, enable_prefix_caching=False,
                   max_model_len=8192, dtype="float16", block_size=32, tensor_parallel_size=2)
    out = render_flags(f, "0.32.0", "cuda")
    assert out["enforce-eager"] is True
    assert out["trust-remote-code"] is True
    assert out["no-enable-prefix-caching"] is True and "enable-prefix-caching" not in out
    assert out["max-model-len"] == 8192
    assert out["dtype"] == "float16"
    assert out["block-size"] == 32
    assert out["tensor-parallel-size"] == 2
    assert "enable-chunked-prefill" not in out


def test_off_is_said_the_way_vllms_config_loader_honours_it() -> None:
    """vLLM 0.32's load_config_file emits `--no-x` for `x: false` only when the top-level parser has
    it (it never does), so "off" must be `no-x: true`; a store_true flag is off by its absence."""
    f = ServeFlags(enable_chunked_prefill=False, enforce_eager=True,
                   extra_args={"enable-log-requests": False, "disable-log-stats": True})
    out = render_flags(f, "0.32.0", "cpu")
    assert out["no-enable-chunked-prefill"] is True
    assert out["no-enable-log-requests"] is True
    assert out["disable-log-stats"] is True
    assert not [k for k, v in out.items() if v is False]
    store_true = ServeFlags.model_construct(headless=False)
    assert render_flags(store_true, "0.32.0", "cpu").get("no-headless") is None


# --- names ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("typo", "suggestion"), [
    ("max_num_seq", "max_num_seqs"),
    ("gpu_memory_utilisation", "gpu_memory_utilization"),
    ("tensor_paralel_size", "tensor_parallel_size"),
    ("enable_prefix_cache", "enable_prefix_caching"),
    ("max-model-length", "max_model_len"),
])
def test_unknown_key_refused_with_closest_name(typo: str, suggestion: str) -> None:
    text = refusal({typo: 1})
    assert "not a known serve flag" in text
    assert suggestion in text.split("did you mean", 1)[1]
    assert "extra_args" in text


def test_unknown_key_without_close_match_has_no_suggestion() -> None:
    text = refusal({"frobnicate": 1})
    assert "not a known serve flag" in text
    assert "did you mean" not in text


def test_kebab_case_keys_accepted() -> None:
    f = ServeFlags.model_validate({"max-num-seqs": 64, "gpu-memory-utilization": 0.8, "enforce-eager": True,
                                   "max-model-len": 4096})
    got = (f.max_num_seqs, f.gpu_memory_utilization, f.enforce_eager, f.max_model_len)
    assert got == (64, 0.8, True, 4096)


@pytest.mark.parametrize("key", ["swap_space", "swap-space"])
def test_swap_space_refused_naming_018_and_alternatives(key: str) -> None:
    text = refusal({key: 4})
    assert "removed in vLLM 0.18" in text
    assert "kv-offloading-size" in text
    assert "cpu-offload-gb" in text


@pytest.mark.parametrize(("key", "names"), [
    ("api_key", "api_key_env"), ("api-key", "api_key_env"), ("hf_token", "hf_token_env"),
])
def test_inline_secrets_refused(key: str, names: str) -> None:
    msgs = messages({key: "sk-live-9f8e7d"})
    assert len(msgs) == 1
    assert "never written into the inventory" in msgs[0]
    assert names in msgs[0]
    assert "sk-live-9f8e7d" not in msgs[0]


# --- extra_args -----------------------------------------------------------------------------------------
def test_extra_args_normalised_to_kebab_and_rendered_last() -> None:
    f = ServeFlags.model_validate({"extra_args": {"--enable-lora": True, "max_loras": 2, "seed": "1",
                                                  "lora-modules": ["a=/x", "b=/y"]}})
    assert f.extra_args == {"enable-lora": True, "max-loras": 2, "seed": "1",
                            "lora-modules": ["a=/x", "b=/y"]}
    out = render_flags(f, "0.32.0", "cpu")
    assert list(out)[-4:] == ["enable-lora", "max-loras", "seed", "lora-modules"]
    assert out["enable-lora"] is True
    assert out["seed"] == "1"


@pytest.mark.parametrize("name", ["-q", "-tp", "--Seed", "--1bit", "--lora modules", "", "--"])
def test_extra_args_short_or_odd_names_refused(name: str) -> None:
    assert "not a long flag name" in refusal({"extra_args": {name: 1}})


@pytest.mark.parametrize(("name", "typed"), [
    ("--max-num-seqs", "max_num_seqs"), ("port", "port"), ("tensor_parallel_size", "tensor_parallel_size"),
    ("--gpu-memory-utilization", "gpu_memory_utilization"), ("--model", "model"),
])
def test_extra_args_typed_flag_not_duplicated(name: str, typed: str) -> None:
    text = refusal({"extra_args": {name: 1}})
    assert f"has a typed field, set {typed} instead" in text


@pytest.mark.parametrize("name", ["--swap-space", "swap_space"])
def test_extra_args_removed_flag_refused(name: str) -> None:
    assert "removed in vLLM 0.18" in refusal({"extra_args": {name: 4}})


@pytest.mark.parametrize("name", ["--api-key", "hf_token"])
def test_extra_args_secret_refused(name: str) -> None:
    msgs = messages({"extra_args": {name: "hf_secretvalue"}})
    assert any("never written into the inventory" in m for m in msgs)
    assert not any("hf_secretvalue" in m for m in msgs)


def test_extra_args_values_must_be_scalars_or_lists() -> None:
    refusal({"extra_args": {"--seed": {"nested": 1}}})
    refusal({"extra_args": {"--seed": None}})


# --- the seed-000 rule ----------------------------------------------------------------------------------
def test_batch_budget_below_context_with_chunked_prefill_off_refused() -> None:
    text = refusal({"max_num_batched_tokens": 2048, "max_model_len": 8192, "enable_chunked_prefill": False})
    assert "max_num_batched_tokens (2048)" in text
    assert "max_model_len (8192)" in text
    assert "chunked prefill" in text


@pytest.mark.parametrize("chunked", [True, None])
def test_batch_budget_below_context_with_chunked_prefill_on_or_default_accepted(chunked: bool | None) -> None:
    f = ServeFlags(max_num_batched_tokens=2048, max_model_len=8192, enable_chunked_prefill=chunked)
    assert f.max_num_batched_tokens == 2048


@pytest.mark.parametrize(("batched", "ctx"), [(8192, 8192), (16384, 8192), (2048, None), (None, 8192)])
def test_batch_budget_not_below_context_accepted_with_chunked_off(batched: int | None,
                                                                  ctx: int | None) -> None:
    f = ServeFlags(max_num_batched_tokens=batched, max_model_len=ctx, enable_chunked_prefill=False)
    assert f.enable_chunked_prefill is False


# --- bounds (property-based) ----------------------------------------------------------------------------
@FAST
@given(st.floats(min_value=0.0, max_value=1.0, exclude_min=True))
def test_gpu_memory_utilization_in_range_accepted_and_rendered_unchanged(v: float) -> None:
    out = render_flags(ServeFlags(gpu_memory_utilization=v), "0.32.0", "cuda")
    assert out["gpu-memory-utilization"] == v


@FAST
@given(st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0, exclude_min=True)))
def test_gpu_memory_utilization_out_of_range_refused(v: float) -> None:
    refusal({"gpu_memory_utilization": v})


@pytest.mark.parametrize("v", [math.nan, math.inf, -math.inf])
def test_gpu_memory_utilization_nan_inf_refused(v: float) -> None:
    refusal({"gpu_memory_utilization": v})


@FAST
@given(st.integers(min_value=1, max_value=65535))
def test_any_valid_port_accepted_and_rendered(port: int) -> None:
    assert render_flags(ServeFlags(port=port), "0.32.0", "cpu")["port"] == port


@FAST
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_port_out_of_range_refused(port: int) -> None:
    assert "port" in refusal({"port": port})


@FAST
@given(st.integers(min_value=1, max_value=65536))
def test_max_num_seqs_in_range(n: int) -> None:
    assert render_flags(ServeFlags(max_num_seqs=n), "0.32.0", "cuda")["max-num-seqs"] == n


@FAST
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65537)))
def test_max_num_seqs_out_of_range_refused(n: int) -> None:
    refusal({"max_num_seqs": n})


@FAST
@given(st.integers(min_value=1, max_value=64))
def test_tensor_parallel_size_in_range(n: int) -> None:
    assert render_flags(ServeFlags(tensor_parallel_size=n), "0.32.0", "cuda")["tensor-parallel-size"] == n


@FAST
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65)))
def test_tensor_parallel_size_out_of_range_refused(n: int) -> None:
    refusal({"tensor_parallel_size": n})


@FAST
@given(st.integers(min_value=-1000, max_value=1000).filter(lambda n: n not in (8, 16, 32, 64, 128, 256)))
def test_block_size_only_the_listed_sizes(n: int) -> None:
    assert any("Input should be" in m for m in messages({"block_size": n}))


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256])
def test_block_size_listed_sizes_accepted(n: int) -> None:
    assert render_flags(ServeFlags(block_size=n), "0.32.0", "cuda")["block-size"] == n


@FAST
@given(st.integers(min_value=16, max_value=10_485_760))
def test_max_model_len_in_range(n: int) -> None:
    assert render_flags(ServeFlags(max_model_len=n), "0.32.0", "cuda")["max-model-len"] == n


@FAST
@given(st.one_of(st.integers(max_value=15), st.integers(min_value=10_485_761)))
def test_max_model_len_out_of_range_refused(n: int) -> None:
    refusal({"max_model_len": n})


@FAST
@given(st.integers(min_value=0, max_value=3600))
def test_shutdown_timeout_in_range(n: int) -> None:
    assert render_flags(ServeFlags(shutdown_timeout=n), "0.32.0", "cuda")["shutdown-timeout"] == n


@FAST
@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=3601)))
def test_shutdown_timeout_out_of_range_refused(n: int) -> None:
    refusal({"shutdown_timeout": n})


_flag_sets = st.fixed_dictionaries({}, optional={
    "gpu_memory_utilization": st.floats(min_value=0.05, max_value=1.0),
    "max_model_len": st.one_of(st.none(), st.integers(16, 131072)),
    "max_num_seqs": st.integers(1, 1024),
    "dtype": st.one_of(st.none(), st.sampled_from(["auto", "bfloat16", "float16", "float32"])),
    "block_size": st.one_of(st.none(), st.sampled_from([8, 16, 32, 64, 128, 256])),
    "tensor_parallel_size": st.one_of(st.none(), st.integers(1, 8)),
    "enable_prefix_caching": st.one_of(st.none(), st.booleans()),
    "enable_chunked_prefill": st.one_of(st.none(), st.just(True)),
    "kv_cache_dtype": st.one_of(st.none(), st.sampled_from(["auto", "fp8"])),
    "shutdown_timeout": st.one_of(st.none(), st.integers(0, 3600)),
    "enforce_eager": st.booleans(),
    "extra_args": st.dictionaries(st.sampled_from(["seed", "max-loras", "disable-log-stats"]),
                                  st.one_of(st.integers(0, 9), st.booleans()), max_size=3),
})


@FAST
@given(_flag_sets, st.sampled_from(["0.10.0", "0.11.0", "0.20.0", "0.32.0", "0.33.0"]),
       st.sampled_from(["cuda", "cpu"]))
def test_render_never_emits_none_or_unaccepted_flags(data: dict, version: str, platform: str) -> None:
    out = render_flags(ServeFlags.model_validate(data), version, platform)
    assert None not in out.values()
    assert all("_" not in k for k in out)
    if platform == "cpu":
        assert "gpu-memory-utilization" not in out
    else:
        assert "gpu-memory-utilization" in out
    if version == "0.10.0":
        assert "shutdown-timeout" not in out
    # the seed values every render carries
    assert out["host"] == "127.0.0.1"
    assert out["port"] == 8000
    assert out["no-trust-remote-code"] is True and "trust-remote-code" not in out


# --- lax input that should be refused -------------------------------------------------------------------
def test_boolean_is_not_a_memory_fraction() -> None:
    refusal({"gpu_memory_utilization": True})


def test_same_flag_in_both_spellings_refused() -> None:
    refusal({"max-num-seqs": 64, "max_num_seqs": 128})
