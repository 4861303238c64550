"""The release matrix (#34): every typed boolean both ways, every typed number and choice at a value other
than its default, and extra_args (inverse aliases included where the release pairs them), rendered by the
toolkit for each release the lab has installed and checked by that release's own parser on the host
(vllm_fleet/host/validate_serve.py). An accepted config is one whose parsed namespace equals the plan,
setting by setting: the check refuses any difference. The model path is absent on purpose, so the
parser, not the engine, answers. tests/hosts/test_cuda_stage_lab.py runs the same matrix on the staged
CUDA 13 builds of 0.31.0-0.33.0, and on 0.34.0's parser (its wheel over 0.33.0's dependencies).
"""

from __future__ import annotations

import json

import pytest
import yaml

import fleetlab as lab
from vllm_fleet.core.flags import ServeFlags, render_flags
from vllm_fleet.core.layout import HOST_TOOLS

ABSENT_MODEL = "/opt/vllm/models/matrix-not-here"
# typed settings, at values other than their defaults, twice: booleans on, then off
TYPED = (
    {"trust_remote_code": True, "enable_prefix_caching": True, "enable_chunked_prefill": True,
     "enforce_eager": True, "max_model_len": 384, "max_num_seqs": 7, "max_num_batched_tokens": 1536,
     "block_size": 32, "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "port": 8123,
     "shutdown_timeout": 17, "gpu_memory_utilization": 0.77, "dtype": "float16", "kv_cache_dtype": "fp8",
     "distributed_executor_backend": "mp", "served_model_name": "matrix", "host": "127.0.0.2"},
    {"trust_remote_code": False, "enable_prefix_caching": False, "enable_chunked_prefill": False,
     "enforce_eager": False, "max_model_len": 640, "max_num_seqs": 9, "max_num_batched_tokens": 2048,
     "block_size": 64, "tensor_parallel_size": 1, "pipeline_parallel_size": 2, "port": 8124,
     "shutdown_timeout": 0, "gpu_memory_utilization": 0.66, "dtype": "bfloat16", "kv_cache_dtype": "auto",
     "distributed_executor_backend": "mp", "served_model_name": "matrix-2", "host": "::1"},
)
# extra_args every release read takes, both ways where they are booleans (none of them one that widens
# what a key holder reaches: the inventory asks for `widen` for those, docs/security.md)
EXTRA = (
    {"disable-sliding-window": True, "disable-cascade-attn": True, "enable-prompt-embeds": True,
     "enable-sleep-mode": True, "enable-server-load-tracking": True, "max-logprobs": 7, "seed": 3,
     "long-prefill-token-threshold": 64, "uvicorn-log-level": "warning", "generation-config": "vllm",
     "max-parallel-loading-workers": 2, "enable-mfu-metrics": True},
    {"disable-sliding-window": False, "disable-cascade-attn": False, "enable-prompt-embeds": False,
     "enable-sleep-mode": False, "enable-server-load-tracking": False, "max-logprobs": 11, "seed": 5,
     "long-prefill-token-threshold": 128, "uvicorn-log-level": "error", "generation-config": "auto",
     "max-parallel-loading-workers": 3, "enable-mfu-metrics": False},
)
# from 0.33: `--enable-x`'s inverse `--disable-x` (and the reverse), as an operator may write them
PAIRED_ALIASES = ({"enable-cascade-attn": True, "disable-prompt-embeds": True},
                  {"disable-sleep-mode": True, "enable-sliding-window": True})


def _stem(key: str) -> str:
    return key.removeprefix("enable-").removeprefix("disable-")


def configs(release: str, platform: str) -> list[dict]:
    """The matrix's configs for one release, rendered by the toolkit as a deploy renders them."""
    out = []
    for typed, extra, aliases in zip(TYPED, EXTRA, PAIRED_ALIASES, strict=True):
        flags = dict(extra)
        if release >= "0.33.0":  # an alias and its setting's own key are one setting: the alias replaces it
            stems = {_stem(a) for a in aliases}
            flags = {**{k: v for k, v in flags.items() if _stem(k) not in stems}, **aliases}
        f = ServeFlags(**typed, extra_args=flags)
        out.append({**render_flags(f, release, platform), "model": ABSENT_MODEL})
    return out


def settings_count(release: str, platform: str) -> int:
    return sum(len(c) for c in configs(release, platform))


def check(host: lab.LabHost, python: str, release: str, platform: str, device: str) -> list[str]:
    """Each config written to the host and checked by the release's parser; the verdicts."""
    verdicts = []
    for i, config in enumerate(configs(release, platform)):
        path = f"/root/matrix/{release}-{i}.yaml"
        lab.ssh(host, f"mkdir -p /root/matrix && cat > {path}", stdin=yaml.safe_dump(config))
        out = lab.ssh(host, f"{python} {HOST_TOOLS}/validate_serve.py {path} --device {device} 2>&1; "
                            "echo rc=$?", timeout=600).stdout
        assert out.strip().endswith("rc=0"), f"{release} config {i}:\n{yaml.safe_dump(config)}\n{out[-3000:]}"
        assert "accepted (parser" in out, out[-2000:]
        found = json.loads(lab.ssh(host, f"cat {path}.at-default").stdout)
        verdicts.append(f"{release} config {i}: {len(config)} settings accepted, "
                        f"{len(found['settings'])} read by setting")
    return verdicts


@pytest.mark.parametrize("release_dir", ["0.32.0-cpu", "0.31.0-cpu"])
def test_every_cpu_release_on_the_lab_takes_the_matrix_as_the_plan_says(deployed, release_dir):
    """lab1's CPU releases: 0.32.0, which every lab test serves, and 0.31.0, which
    tests/hosts/test_safe_change.py installs (this file's name sorts after it, so a full run reads both;
    run alone, the 0.31.0 case says it was skipped)."""
    host = lab.LabHost(1)
    have = lab.ssh(host, "ls /opt/vllm/releases").stdout.split()
    if release_dir not in have:
        assert release_dir != "0.32.0-cpu", have
        pytest.skip(f"{release_dir} is not on lab1: tests/hosts/test_safe_change.py installs it")
    release = release_dir.removesuffix("-cpu")
    done = check(host, f"/opt/vllm/releases/{release_dir}/bin/python", release, "cpu", "cpu")
    print("\n".join(done))
