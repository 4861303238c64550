"""Node groups (vllm_fleet/core/cluster.py and the planner's multi-node rules). GPUs are built literally (no
GPU
here); the lab test tests/hosts/test_cluster.py runs a real two-host group on the CPU build."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from vllm_fleet.controller.rollout import keep_groups_together, waves
from vllm_fleet.core import render
from vllm_fleet.core.cluster import disagreements, resolve, shape
from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.plan import HostFacts, plan_host
from vllm_fleet.core.spec import SpecError, parse_host

ENV = {"VLLM_API_KEY": "sk-cluster-test"}
M = {"name": "llama-405b", "host_path": "/srv/models/llama-405b"}
NODES = ["gpu-a", "gpu-b"]
ADDR = {"gpu-a": "10.1.0.11", "gpu-b": "10.1.0.12"}
HEADS = {"num_attention_heads": 128, "num_key_value_heads": 8, "num_hidden_layers": 126}


def gpus(n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", memory_mib=81559,
                     compute_capability=(9, 0), pci_bus_id=f"0:{i}", minor=i) for i in range(n))


def fake_variant(version: str, accelerator: str, driver: Any, gpu_list: list, override: str | None):
    name = "cpu" if accelerator == "cpu" else "cu130"
    return SimpleNamespace(variant=name, reason="fake", release_dir=f"{version}-{name}",
                           build=SimpleNamespace(index_url=None, extra_index_urls=(), index_strategy=None,
                                                 accelerator="cuda" if name.startswith("cu") else "cpu"))


def node_data(name: str, **over: Any) -> dict[str, Any]:
    cluster = {"name": "big", "nodes": NODES, **over.pop("cluster", {})}
    return {"model": M, "cluster": cluster, **over}


def specs(**per_host: dict[str, Any]) -> dict:
    return {n: parse_host(n, per_host.get(n, node_data(n))) for n in NODES}


def plans(split: str = "pipeline", n_gpus: int = 8, accelerator: str = "cuda", **host_over: Any) -> dict:
    data = {n: node_data(n, cluster={"split": split}, accelerator=accelerator, **host_over) for n in NODES}
    s = {n: parse_host(n, d) for n, d in data.items()}
    roles = resolve(s, ADDR)
    out = {}
    for n in NODES:
        facts = HostFacts(gpus=gpus(n_gpus) if accelerator == "cuda" else (),
                          interfaces={ADDR[n]: "ens5", "127.0.0.1": "lo"})
        out[n] = plan_host(n, s[n], facts, ENV, {"default": HEADS}, choose_variant=fake_variant,
                           node=roles[n])
    return out


def problems(fn) -> list[str]:
    with pytest.raises(SpecError) as e:
        fn()
    return e.value.problems


# --- resolve: the whole inventory, before any host is touched ------------------------------------------
def test_ranks_follow_the_node_list_and_addresses_default_to_ssh_hostname() -> None:
    roles = resolve(specs(), ADDR)
    assert roles["gpu-a"].rank == 0 and roles["gpu-a"].is_head
    assert roles["gpu-b"].rank == 1 and roles["gpu-b"].head_address == "10.1.0.11"
    assert roles["gpu-b"].address == "10.1.0.12" and roles["gpu-b"].nnodes == 2


def test_explicit_address_wins_over_ssh_hostname() -> None:
    s = specs(**{"gpu-b": node_data("gpu-b", cluster={"address": "192.168.50.2"})})
    assert resolve(s, ADDR)["gpu-b"].address == "192.168.50.2"


def test_release_mismatch_across_nodes_is_refused_naming_the_node() -> None:
    s = specs(**{"gpu-b": node_data("gpu-b", version="0.31.0")})
    p = problems(lambda: resolve(s, ADDR))
    assert any(x.startswith("gpu-b: vllm.version: differs from the head gpu-a's") and "0.31.0" in x
               for x in p)


@pytest.mark.parametrize(("field", "over"), [
    ("instances[default].flags", {"flags": {"max_model_len": 4096}}),
    ("instances[default].model", {"model": {"name": "other", "host_path": "/srv/models/other"}}),
    ("instances[default].env", {"env": {"NCCL_DEBUG": "INFO"}}),
])
def test_every_node_runs_the_same_model_and_flags(field: str, over: dict) -> None:
    s = specs(**{"gpu-b": node_data("gpu-b", **over)})
    found = problems(lambda: resolve(s, ADDR))
    assert any(x.startswith(f"gpu-b: vllm.{field}: differs from the head") for x in found), found


def test_node_lists_must_agree_and_name_inventory_hosts() -> None:
    s = specs(**{"gpu-b": node_data("gpu-b", cluster={"nodes": ["gpu-b", "gpu-a"]})})
    found = problems(lambda: resolve(s, ADDR))
    assert any("gpu-b: vllm.cluster.nodes:" in x and "differs" in x for x in found), found
    s = {"gpu-a": parse_host("gpu-a", node_data("gpu-a", cluster={"nodes": ["gpu-a", "gpu-z"]}))}
    assert problems(lambda: resolve(s, ADDR)) == [
        "gpu-a: vllm.cluster.nodes: 'gpu-z' is not in the inventory"]


def test_a_listed_node_without_the_cluster_is_refused() -> None:
    s = {"gpu-a": parse_host("gpu-a", node_data("gpu-a")), "gpu-b": parse_host("gpu-b", {"model": M})}
    assert problems(lambda: resolve(s, ADDR)) == [
        "gpu-b: vllm.cluster: listed as a node of cluster 'big' but declares no cluster"]


def test_missing_or_shared_addresses_are_refused() -> None:
    p = problems(lambda: resolve(specs(), {"gpu-a": "gpu-a.example", "gpu-b": "10.1.0.12"}))
    assert p[0].startswith("gpu-a: vllm.cluster.address: not set, and ssh_hostname 'gpu-a.example'")
    p = problems(lambda: resolve(specs(), {"gpu-a": "10.1.0.12", "gpu-b": "10.1.0.12"}))
    assert p == ["gpu-b: vllm.cluster.address: 10.1.0.12 is already the address of gpu-a"]


def test_schema_refusals_name_the_field() -> None:
    with pytest.raises(SpecError) as e:
        parse_host("gpu-a", node_data("gpu-a", cluster={"address": "gpu-a.lan"}))
    assert e.value.problems[0].startswith("gpu-a: vllm.cluster.address: 'gpu-a.lan' is not an IP address")
    with pytest.raises(SpecError) as e:
        parse_host("gpu-a", {"instances": [{"model": M}, {"name": "b", "model": M, "flags": {"port": 8001}}],
                             "cluster": {"name": "big", "nodes": NODES}})
    assert "a cluster node runs one instance" in e.value.problems[0]
    with pytest.raises(SpecError) as e:
        parse_host("gpu-a", {"model": M, "flags": {"node_rank": 1}})
    assert e.value.problems[0].startswith("gpu-a: vllm.instances[default].flags.node_rank: set by vllm-fleet")


# --- the plan: flags, environment, unit -----------------------------------------------------------------
def test_pipeline_split_is_one_stage_per_node_and_tp_over_its_gpus() -> None:
    p = plans("pipeline")
    head, worker = p["gpu-a"].instances[0], p["gpu-b"].instances[0]
    assert (head.tensor_parallel, head.pipeline_parallel) == (8, 2)
    assert head.flags["nnodes"] == 2 and head.flags["node-rank"] == 0 and "headless" not in head.flags
    assert worker.flags["node-rank"] == 1 and worker.flags["headless"] is True
    # the head's API is guarded by the key; the headless worker has no API, so its validation expects no
    # guard (vLLM parses no middleware there)
    assert head.key_guarded and not worker.key_guarded and "middleware" not in worker.flags
    assert worker.flags["master-addr"] == "10.1.0.11" and worker.flags["master-port"] == 29501
    assert worker.flags["distributed-executor-backend"] == "mp"
    assert worker.environment["VLLM_HOST_IP"] == "10.1.0.12"
    assert worker.environment["GLOO_SOCKET_IFNAME"] == "ens5" == worker.environment["NCCL_SOCKET_IFNAME"]
    assert worker.ip_allow == ("localhost", "10.1.0.11", "10.1.0.12")


def test_tensor_split_is_one_group_over_every_gpu() -> None:
    p = plans("tensor")
    inst = p["gpu-b"].instances[0]
    assert (inst.tensor_parallel, inst.pipeline_parallel) == (16, 1)
    assert inst.flags["tensor-parallel-size"] == 16 and inst.flags["pipeline-parallel-size"] == 1


def test_tensor_split_that_does_not_divide_the_heads_is_refused() -> None:
    p = problems(lambda: plans("tensor", n_gpus=3))
    assert p[0].startswith("gpu-a: vllm.instances[default].flags.tensor_parallel_size: 6 across 2 nodes does "
                           "not divide the model's 128 attention heads")


def test_cpu_nodes_run_one_worker_each() -> None:
    p = plans("tensor", accelerator="cpu")
    inst = p["gpu-a"].instances[0]
    assert inst.tensor_parallel == 2 and "NCCL_SOCKET_IFNAME" not in inst.environment
    assert inst.environment["GLOO_SOCKET_IFNAME"] == "ens5"


def test_pipeline_size_other_than_the_node_count_is_refused() -> None:
    p = problems(lambda: plans("pipeline", flags={"pipeline_parallel_size": 3}))
    assert "pipeline_parallel_size: 3, but cluster 'big' has 2 nodes" in p[0]


def test_uni_executor_is_refused_on_a_node() -> None:
    p = problems(lambda: plans(flags={"distributed_executor_backend": "uni"}))
    assert p[0].startswith("gpu-a: vllm.instances[default].flags.distributed_executor_backend: 'uni'")


def test_an_address_the_host_does_not_have_is_refused() -> None:
    s = specs()
    roles = resolve(s, ADDR)
    with pytest.raises(SpecError) as e:
        plan_host("gpu-b", s["gpu-b"], HostFacts(gpus=gpus(8), interfaces={"10.9.9.9": "eth0"}), ENV,
                  {"default": HEADS}, choose_variant=fake_variant, node=roles["gpu-b"])
    assert e.value.problems == ["gpu-b: vllm.cluster.address: 10.1.0.12 is not an address of this host "
                                "(it has 10.9.9.9 on eth0)"]


def test_public_api_on_the_head_drops_the_address_filter_with_a_warning() -> None:
    p = plans(flags={"host": "0.0.0.0"})
    assert p["gpu-a"].instances[0].ip_allow == ()
    assert any("firewall port 29501" in w for w in p["gpu-a"].warnings)
    assert p["gpu-b"].instances[0].ip_allow  # a worker serves no API: always filtered


def test_rendered_worker_config_and_unit() -> None:
    p = plans()
    plan, inst = p["gpu-b"], p["gpu-b"].instances[0]
    cfg = yaml.safe_load(render.serve_config(plan, inst))
    assert cfg["headless"] is True and cfg["nnodes"] == 2 and cfg["master-addr"] == "10.1.0.11"
    unit = render.unit(plan, inst)
    assert "Restart=always" in unit and "IPAddressDeny=any" in unit
    assert "IPAddressAllow=localhost 10.1.0.11 10.1.0.12" in unit
    env = render.environment_file(inst)
    assert 'VLLM_HOST_IP="10.1.0.12"' in env.splitlines()  # the 0600 environment file, not the unit
    solo = plan_host("solo", parse_host("solo", {"model": M}), HostFacts(gpus=gpus(1)), ENV,
                     choose_variant=fake_variant)
    solo_unit = render.unit(solo, solo.instances[0])
    assert "IPAddressDeny" not in solo_unit and "Restart=on-failure" in solo_unit
    assert "nnodes" not in render.serve_config(solo, solo.instances[0])


# --- rollouts keep a group in one wave ------------------------------------------------------------------
def test_cluster_nodes_share_a_wave() -> None:
    hosts = ["a", "b", "c", "d", "e"]
    plan = keep_groups_together(waves(hosts, canary=1, wave="1"), {"b": "big", "d": "big"})
    assert plan == [["a"], ["b", "d"], ["c"], ["e"]]
    assert keep_groups_together([["a", "b"]], {}) == [["a", "b"]]


def test_a_node_whose_peer_failed_its_checks_changes_nothing() -> None:
    """The barrier before a node group's switch and restart (roles/service.py group_barrier):
    pyinfra's
    state after the validate operation ran on every node. A failed worker fails the head (no restart
    into a group that cannot form); a failure outside the group, or none, lets the node go on."""
    from vllm_fleet.roles.service import group_intact

    logged: list[str] = []

    def node(name: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, log_styled=lambda text, **_: logged.append(text))

    head, worker, other = node("gpu-a"), node("gpu-b"), node("db-1")
    nodes = ("gpu-a", "gpu-b")
    assert group_intact(SimpleNamespace(failed_hosts=set()), head, nodes, "pair")
    assert group_intact(SimpleNamespace(failed_hosts=[other]), head, nodes, "pair")
    assert not group_intact(SimpleNamespace(failed_hosts=[worker]), head, nodes, "pair")
    assert logged == ["not changed: node(s) gpu-b of cluster pair failed before the restart, so the group "
                      "cannot form on the new config"]


def test_a_master_port_equal_to_a_serve_port_is_refused_before_any_host_is_touched() -> None:
    """It passed the plan and broke the deploy: the head's torch.distributed store listens on every
    address of the head, so the API (or another instance) cannot have that port."""
    s = {n: parse_host(n, node_data(n, cluster={"master_port": 8000})) for n in NODES}
    found = problems(lambda: resolve(s, ADDR))
    assert any(x.startswith("gpu-a: vllm.instances[default].flags.port: 8000 is cluster 'big''s master_port")
               for x in found), found


# --- what each node's facts decide: one engine across the group (roles/hostplan.agrees_with_group) ---------
def node_shapes(n_gpus: dict[str, int], pythons: dict[str, str] | None = None,
                capability: dict[str, tuple[int, int]] | None = None) -> dict[str, dict]:
    data = {n: node_data(n, cluster={"split": "tensor"}) for n in NODES}
    s = {n: parse_host(n, d) for n, d in data.items()}
    roles = resolve(s, ADDR)
    out = {}
    for n in NODES:
        g = tuple(x.__class__(**{**x.__dict__, "compute_capability": (capability or {}).get(n, (9, 0))})
                  for x in gpus(n_gpus[n]))
        p = plan_host(n, s[n], HostFacts(gpus=g, interfaces={ADDR[n]: "ens5", "127.0.0.1": "lo"}), ENV,
                      {"default": HEADS}, choose_variant=fake_variant, node=roles[n])
        i = p.instances[0]
        out[n] = (roles[n], shape(p.release, (pythons or {}).get(n, "3.13"), len(i.gpu_indexes),
                                  i.tensor_parallel, i.pipeline_parallel, i.dtype))
    return out


def test_nodes_whose_facts_agree_start_one_engine() -> None:
    out = node_shapes({"gpu-a": 8, "gpu-b": 8})
    assert disagreements(out["gpu-b"][0], out["gpu-b"][1], {"gpu-a": out["gpu-a"][1]}) == []


def test_a_node_with_other_gpus_or_another_python_is_refused_naming_both_nodes_and_what_to_change() -> None:
    """The inventory agrees (no gpus list: each node takes all of its own); the facts do not: 8 GPUs on
    the head make tensor parallelism 16 there, 4 on the worker make it 8, so the group would never form."""
    out = node_shapes({"gpu-a": 8, "gpu-b": 4}, pythons={"gpu-b": "3.11"})
    role, mine = out["gpu-b"]
    found = disagreements(role, mine, {"gpu-a": out["gpu-a"][1]})
    assert [p.split(":")[2].split(" is ")[0].strip() for p in found] == ["python", "gpus", "tensor_parallel"]
    assert found[1] == ("gpu-b: cluster 'big': gpus is 4 here and 8 on gpu-a; every node of a group starts "
                        "the same engine (each node computes its share of the world size from its own GPUs: "
                        "give every node the same number (vllm.instances[].gpus))")
    # the node planned first has nothing to compare with; the head is named when it was planned
    assert disagreements(out["gpu-a"][0], out["gpu-a"][1], {}) == []


def test_gpus_that_pick_another_dtype_are_a_disagreement() -> None:
    out = node_shapes({"gpu-a": 8, "gpu-b": 8}, capability={"gpu-b": (7, 5)})
    found = disagreements(out["gpu-b"][0], out["gpu-b"][1], {"gpu-a": out["gpu-a"][1]})
    assert len(found) == 1 and "dtype is 'float16' here and 'bfloat16' on gpu-a" in found[0]
