"""Tensor and pipeline parallelism: what an instance's GPUs (or a node group's) and its model's attention
heads allow, decided before vLLM would refuse it at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.spec import InstanceSpec, SpecError

if TYPE_CHECKING:
    from vllm_fleet.core.flags import ServeFlags


def choose_tensor_parallel(host: str, inst_name: str, n_gpus: int, explicit: int | None,
                           heads: int | None, kv_heads: int | None) -> tuple[int, list[str]]:
    """TP must divide the attention heads (and suit the KV heads); vLLM refuses otherwise at start-up."""

    def fits(tp: int) -> bool:
        if heads is not None and heads % tp:
            return False
        return not (kv_heads is not None and kv_heads % tp and tp % kv_heads)

    where = f"{host}: vllm.instances[{inst_name}].flags.tensor_parallel_size"
    if explicit is not None:
        if explicit > max(n_gpus, 1):
            raise SpecError([f"{where}: {explicit} is more than the {n_gpus} GPU(s) given to the instance"])
        if not fits(explicit):
            raise SpecError([f"{where}: {explicit} does not divide the model's {heads} attention heads "
                             f"({kv_heads} KV heads); use one of {_divisors(heads, kv_heads, n_gpus)}"])
        return explicit, []
    if n_gpus <= 1:
        return 1, []
    if fits(n_gpus):
        return n_gpus, []
    tp = 1
    while tp * 2 <= n_gpus and fits(tp * 2):
        tp *= 2
    return tp, [f"{host}: vllm.instances[{inst_name}]: {n_gpus} GPUs do not divide the model's {heads} "
                f"attention heads; using tensor-parallel-size {tp} ({n_gpus - tp} GPU(s) idle)"]


def _divisors(heads: int | None, kv_heads: int | None, n: int) -> list[int]:
    out = []
    for tp in range(1, max(n, 1) + 1):
        if heads is not None and heads % tp:
            continue
        if kv_heads is not None and kv_heads % tp and tp % kv_heads:
            continue
        out.append(tp)
    return out


def cluster_parallel(host: str, inst_name: str, node: NodeRole, accelerator: str, n_gpus: int, f: ServeFlags,
                     heads: int | None, kv_heads: int | None, warnings: list[str]) -> tuple[int, int, int]:
    """(tensor, pipeline, workers on this node) for a node group.

    vLLM's mp executor runs world_size / nnodes workers on every node, so the layout must divide evenly:
    `pipeline` puts one stage per node and tensor-parallel over the node's GPUs; `tensor` makes one
    tensor-parallel group of every node's GPUs. A CPU node runs one worker.
    """
    where = f"{host}: vllm.instances[{inst_name}].flags"
    if f.distributed_executor_backend not in (None, "mp"):
        raise SpecError([f"{where}.distributed_executor_backend: {f.distributed_executor_backend!r}, "
                         f"but cluster '{node.cluster}' runs vLLM's multi-node mode, which needs 'mp'; "
                         "leave it unset"])
    local = n_gpus if accelerator == "cuda" else 1
    if node.split == "pipeline":
        if f.pipeline_parallel_size not in (1, node.nnodes):
            raise SpecError([f"{where}.pipeline_parallel_size: {f.pipeline_parallel_size}, but cluster "
                             f"'{node.cluster}' has {node.nnodes} nodes, one pipeline stage each; "
                             "leave it unset"])
        tp, tp_warn = choose_tensor_parallel(host, inst_name, local, f.tensor_parallel_size, heads, kv_heads)
        warnings.extend(tp_warn)
        return tp, node.nnodes, tp
    if f.pipeline_parallel_size != 1:
        raise SpecError([f"{where}.pipeline_parallel_size: split 'tensor' runs one stage over every node; "
                         "use split 'pipeline' for pipeline stages"])
    total = f.tensor_parallel_size or node.nnodes * local
    if total % node.nnodes or total > node.nnodes * local:
        raise SpecError([f"{where}.tensor_parallel_size: {total} must be a multiple of the {node.nnodes} "
                         f"nodes and at most {node.nnodes * local} ({local} per node)"])
    kv_bad = kv_heads is not None and kv_heads % total and total % kv_heads
    if (heads is not None and heads % total) or kv_bad:
        raise SpecError([f"{where}.tensor_parallel_size: {total} across {node.nnodes} nodes does not divide "
                         f"the model's {heads} attention heads ({kv_heads} KV heads); use split 'pipeline'"])
    return total, 1, total // node.nnodes


def instance_parallel(host: str, inst: InstanceSpec, accelerator: str, n_gpus: int, node: NodeRole | None,
                      model_config: Mapping[str, Any] | None, warnings: list[str]) -> tuple[int, int, int]:
    """(tensor, pipeline, GPUs used here) of one instance given `n_gpus`: pipeline stages split the
    GPUs, tensor parallelism works within a stage; a node group's layout is the group's."""
    where = f"{host}: vllm.instances[{inst.name}]"
    f = inst.flags
    heads = kv_heads = None
    if model_config:
        heads = model_config.get("num_attention_heads")
        kv_heads = model_config.get("num_key_value_heads", heads)
    if node is not None:
        return cluster_parallel(host, inst.name, node, accelerator, n_gpus, f, heads, kv_heads, warnings)
    pp = f.pipeline_parallel_size
    if accelerator == "cuda" and pp > n_gpus:
        raise SpecError([f"{where}.flags.pipeline_parallel_size: {pp} stages need at least {pp} GPUs, "
                         f"the instance has {n_gpus}"])
    tp, tp_warn = choose_tensor_parallel(host, inst.name, n_gpus // pp if n_gpus else 0,
                                         f.tensor_parallel_size, heads, kv_heads)
    warnings.extend(tp_warn)
    if f.distributed_executor_backend == "uni" and tp * pp > 1:
        # vLLM's UniProcExecutor runs one worker: with more ranks it waits for ranks that never start
        raise SpecError([f"{where}.flags.distributed_executor_backend: 'uni' runs a single worker, but "
                         f"this instance runs tensor {tp} x pipeline {pp}; vLLM would hang at start-up "
                         "waiting for the other ranks: use 'mp' (or leave it unset)"])
    return tp, pp, tp * pp
