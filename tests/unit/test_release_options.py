"""Each release's own option list (vllm_fleet/data/options/, read by the release: scripts/release_options.py)
against what the toolkit renders, and the plan's refusal of an option a release does not have."""

from __future__ import annotations

import pytest

from vllm_fleet.core import flags, variants
from vllm_fleet.core.startup import startup_refusals

# Why a release of the table has no option list: it could not be read without a GPU.
NOT_READ = {"0.20.0": "its CUDA build stops at 'Failed to infer device type' without a GPU, even with "
                      "VLLM_TARGET_DEVICE=cpu, and PyPI has no CPU build of it"}
READ = sorted(r for r in variants.load_table() if r not in NOT_READ)


def test_every_release_of_the_table_has_its_option_list_or_a_reason() -> None:
    missing = [r for r in variants.load_table() if flags.release_options(r) is None and r not in NOT_READ]
    assert not missing, f"run scripts/release_options.py for {missing}"
    assert all(flags.release_options(r) is None for r in NOT_READ)


@pytest.mark.parametrize("release", READ)
def test_every_off_form_the_toolkit_renders_is_an_option_of_that_release_that_turns_its_setting_off(
        release: str) -> None:
    """flags.off_key (from the parser facts read with ast) against the release's own parser: both read
    from the wheels by different means, and they must agree."""
    options = flags.release_options(release)
    assert options is not None
    for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "trust_remote_code"):
        key = flags.off_key(name.replace("_", "-"), release)
        assert options[key]["dest"] == name and options[key]["sets"] is False, (release, key)
        assert options[name.replace("_", "-")]["sets"] is True


@pytest.mark.parametrize("release", READ)
def test_the_rendered_defaults_are_options_of_every_release(release: str) -> None:
    rendered = flags.render_flags(flags.ServeFlags(model="/m", served_model_name="m", tensor_parallel_size=1,
                                                   block_size=16), release, "cuda")
    options = flags.release_options(release)
    assert options is not None and [k for k in rendered if k not in options] == []


def test_a_flag_the_release_does_not_have_is_refused_in_the_plan_naming_host_and_field() -> None:
    f = flags.render_flags(flags.ServeFlags(model="/m", served_model_name="m",
                                            extra_args={"max-num-partial-prefill": 2}), "0.32.0", "cpu")
    out = startup_refusals("gpu-1", "default", f, vllm_version="0.32.0", accelerator="cpu")
    assert out == ["gpu-1: vllm.instances[default].flags.extra_args.max-num-partial-prefill: vLLM 0.32.0 has "
                   "no --max-num-partial-prefill; allowed: an option of vLLM 0.32.0's `vllm serve`"]
    typo = flags.render_flags(flags.ServeFlags(model="/m", extra_args={"max-logprob": 3}), "0.33.0", "cpu")
    out = startup_refusals("gpu-1", "default", typo, vllm_version="0.33.0", accelerator="cpu")
    assert len(out) == 1 and "did you mean max-logprobs" in out[0]
    # 0.33's inverse alias is an option of 0.33, not of 0.32
    alias = flags.render_flags(flags.ServeFlags(model="/m", extra_args={"enable-cascade-attn": True}),
                               "0.33.0", "cpu")
    assert startup_refusals("gpu-1", "default", alias, vllm_version="0.33.0", accelerator="cpu") == []
    assert startup_refusals("gpu-1", "default", alias, vllm_version="0.32.0", accelerator="cpu") != []
    # a release not read is left to the host check
    assert startup_refusals("gpu-1", "default", f, vllm_version="0.20.0", accelerator="cpu") == []
