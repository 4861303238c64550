"""Node groups: hosts that serve one model together with vLLM's multi-node mode. Pure, no I/O.

Multi-node vLLM breaks in a few well-known ways: nodes on different releases or flags, a wrong
VLLM_HOST_IP, a rank given twice. All of them are decided here from the whole inventory, before any host
is touched, so one node's typo stops the group instead of leaving a head waiting for a worker forever.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_fleet.core.spec import HostSpec, SpecError


@dataclass(frozen=True)
class NodeRole:
    """One host's place in its node group, as the planner and the unit need it."""

    cluster: str
    rank: int
    nodes: tuple[str, ...]  # host names, head first
    addresses: tuple[str, ...]  # the nodes' cluster addresses, same order
    split: str
    master_port: int

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def address(self) -> str:
        return self.addresses[self.rank]

    @property
    def head_address(self) -> str:
        return self.addresses[0]

    @property
    def store(self) -> str:
        """The group's identity in a run: the head's torch.distributed store, as the nodes' configs say."""
        return f"{self.head_address}:{self.master_port}"

    def describe(self) -> str:
        role = "head" if self.is_head else "worker"
        return (f"{self.cluster}: node {self.rank} of {self.nnodes} ({role}, {self.address}), "
                f"split {self.split}, store {self.store}")


def _ip(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


# What every node of a group must agree on: vLLM starts the same engine on each of them.
def _same(spec: HostSpec) -> dict[str, object]:
    inst = spec.instances[0]
    return {
        "version": spec.version,
        "accelerator": spec.accelerator,
        "variant": spec.variant,
        "instances[*].model": inst.model.model_dump(),
        "instances[*].flags": inst.flags.model_dump(),
        "instances[*].env": inst.env,
        "instances[*].gpus": inst.gpus,
        "instances[*].name": inst.name,
        "cluster.split": spec.cluster.split if spec.cluster else None,
        "cluster.master_port": spec.cluster.master_port if spec.cluster else None,
    }


def resolve(specs: Mapping[str, HostSpec], ssh_hostnames: Mapping[str, str | None]) -> dict[str, NodeRole]:
    """host -> its NodeRole, for every host that declares a cluster; SpecError naming host and field."""
    problems: list[str] = []
    groups: dict[str, list[str]] = {}
    for name, spec in specs.items():
        if spec.cluster:
            groups.setdefault(spec.cluster.name, []).append(name)
    roles: dict[str, NodeRole] = {}
    for cluster, members in groups.items():
        declared = specs[members[0]].cluster
        assert declared is not None
        nodes = declared.nodes
        for name in members:
            c = specs[name].cluster
            assert c is not None
            if c.nodes != nodes:
                problems.append(f"{name}: vllm.cluster.nodes: {c.nodes} differs from {members[0]}'s {nodes} "
                                f"(one list per cluster '{cluster}', head first)")
            if name not in c.nodes:
                problems.append(f"{name}: vllm.cluster.nodes: this host declares cluster '{cluster}' but is "
                                f"not in its nodes {c.nodes}")
        for node in nodes:
            if node not in specs:
                problems.append(f"{members[0]}: vllm.cluster.nodes: '{node}' is not in the inventory")
            elif node not in members:
                other = specs[node].cluster
                problems.append(f"{node}: vllm.cluster: listed as a node of cluster '{cluster}' but declares "
                                f"{repr(other.name) if other else 'no cluster'}")
        if problems:
            continue
        head = specs[nodes[0]]
        want = _same(head)
        for node in nodes[1:]:
            got = _same(specs[node])
            for key, value in want.items():
                if got[key] != value:
                    path = key.replace("[*]", f"[{specs[node].instances[0].name}]")
                    problems.append(f"{node}: vllm.{path}: differs from the head {nodes[0]}'s; every node of "
                                    f"cluster '{cluster}' runs the same release, model and flags "
                                    f"(head: {value!r}, here: {got[key]!r})")
        addresses: list[str] = []
        for node in nodes:
            c = specs[node].cluster
            assert c is not None
            addr = _ip(c.address) or _ip(ssh_hostnames.get(node))
            if addr is None:
                problems.append(f"{node}: vllm.cluster.address: not set, and ssh_hostname "
                                f"{ssh_hostnames.get(node)!r} is not an IP address; give the node's address "
                                "on the cluster network")
            elif addr in addresses:
                problems.append(f"{node}: vllm.cluster.address: {addr} is already the address of "
                                f"{nodes[addresses.index(addr)]}")
            addresses.append(addr or "")
        for node in nodes:  # the head's store listens on every address of the head: no serve port there
            for inst in specs[node].instances:
                if inst.flags.port == declared.master_port:
                    problems.append(f"{node}: vllm.instances[{inst.name}].flags.port: {inst.flags.port} is "
                                    f"cluster '{cluster}''s master_port (the head's torch.distributed "
                                    "store); give one of them another port")
        if problems:
            continue
        for rank, node in enumerate(nodes):
            roles[node] = NodeRole(cluster, rank, tuple(nodes), tuple(addresses), declared.split,
                                   declared.master_port)
    if problems:
        raise SpecError(problems)
    return roles


# Why nodes that agree in the inventory can still start different engines: what each node's own facts
# decide. Field -> what to change.
_SHAPE_ADVICE = {
    "release": "the build each node's driver allows differs: pin vllm.variant for the group's hosts",
    "python": "vLLM and torch come from one lock per Python version: put the group's nodes on one OS "
              "release",
    "gpus": "each node computes its share of the world size from its own GPUs: give every node the same "
            "number (vllm.instances[].gpus)",
    "tensor_parallel": "each node computes its share of the world size from its own GPUs: give every node "
                       "the same number (vllm.instances[].gpus)",
    "pipeline_parallel": "set pipeline parallelism the same on every node",
    "dtype": "the GPUs' compute capability picks bf16 or fp16: set flags.dtype for the group",
}


def shape(release: str, python: str, gpus: int, tensor_parallel: int, pipeline_parallel: int,
          dtype: str) -> dict[str, object]:
    """What a node's plan starts, as far as its facts decide it (the inventory's part is _same's)."""
    return {"release": release, "python": python, "gpus": gpus, "tensor_parallel": tensor_parallel,
            "pipeline_parallel": pipeline_parallel, "dtype": dtype}


def disagreements(node: NodeRole, mine: Mapping[str, object],
                  planned: Mapping[str, Mapping[str, object]]) -> list[str]:
    """`node`'s shape against the nodes of its group planned before it in this run (the head first when
    it was): vLLM starts one engine across them, so a difference fails at start-up (a world size the
    nodes disagree on hangs the group) instead of at plan time."""
    me = node.nodes[node.rank]
    others = [n for n in node.nodes if n in planned and n != me]
    if not others:
        return []
    other = others[0]
    return [f"{me}: cluster '{node.cluster}': {key} is {value!r} here and {planned[other][key]!r} on "
            f"{other}; every node of a group starts the same engine ({_SHAPE_ADVICE[key]})"
            for key, value in mine.items() if planned[other].get(key) != value]
