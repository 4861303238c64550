"""Host data for the lab inventory: lab hosts serve the locally made tiny model on the CPU build."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fleet import lab

TINY_MODEL = Path(os.environ.get("VLLM_FLEET_TINY_MODEL", str(lab.CACHE_DIR / "models" / "tiny-llama")))


def lab_vllm(index: int) -> dict[str, Any]:
    """The CPU settings measured on this machine's lab: eager mode and the in-process executor start
    in ~45 s instead of ~150 s; the tiny model needs only 512 tokens of context."""
    return {
        "accelerator": "cpu",
        "ready_timeout_s": 420,
        "model": {"name": "tiny-llama", "path": str(TINY_MODEL)},
        "flags": {
            "max_model_len": 512,
            "max_num_seqs": 8,
            "enforce_eager": True,
            "host": "127.0.0.1",
            "extra_args": {"distributed-executor-backend": "uni"},
        },
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
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
