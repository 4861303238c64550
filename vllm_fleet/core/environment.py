"""What an instance's unit runs with besides its flags: the environment, the devices and addresses it
may use, its watchdog, the controller's secrets it needs, and the indexes its release is resolved from.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.hub import HF_HOME
from vllm_fleet.core.layout import KEYGUARD_DIR, STATE_DIR
from vllm_fleet.core.lock import IndexSettings, settings_for
from vllm_fleet.core.spec import InstanceSpec, SpecError
from vllm_fleet.host.watchdog import probe_address

if TYPE_CHECKING:
    from vllm_fleet.core.spec import HostSpec
    from vllm_fleet.core.variants import Variant


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def index_settings(build: Variant, spec: HostSpec, environ: Mapping[str, str]) -> IndexSettings:
    """The fleet's `package_index`, else the variant's indexes; VLLM_FLEET_VARIANT_INDEXES=0 skips the
    table's public indexes for a controller that reaches only PyPI or a mirror.

    The controller's find-links folders (VLLM_FLEET_FIND_LINKS: torch's CPU build is on no PyPI) are
    searched for CPU builds only: uv takes a find-links `torch 2.13.0+cpu` for a CUDA build's
    `torch==2.13.0` (a local version matches the plain one)."""
    fleet = spec.package_index.model_dump() if spec.package_index else None
    find_links = [p for p in environ.get("VLLM_FLEET_FIND_LINKS", "").split(",") if p]
    return settings_for(build.index_url, build.extra_index_urls, build.index_strategy, fleet,
                        find_links if build.accelerator == "cpu" else [],
                        public_indexes=environ.get("VLLM_FLEET_VARIANT_INDEXES", "1") != "0")


def missing_secrets(host: str, inst: InstanceSpec, environ: Mapping[str, str]) -> list[str]:
    """Secrets are read from the controller's environment; a missing one is refused by its name. An HF
    token only where something is fetched from a hub."""
    wanted = [("VLLM_API_KEY on the host", inst.api_key_env)]
    if inst.model.hf_repo:
        wanted.append(("the hub fetch's token", inst.hf_token_env))
    return [
        f"{host}: vllm.instances[{inst.name}]: {ctl_var} is not set (or empty) in the controller's "
        f"environment; export it before deploying (it becomes {what})"
        for what, ctl_var in wanted if ctl_var and not environ.get(ctl_var)
    ]


def rdma_devices(devices: Sequence[str], node: NodeRole | None) -> tuple[str, ...]:
    """The /dev/infiniband nodes a unit allows: only a cluster node's (one host's GPUs talk over NVLink
    or PCIe, not RDMA), else NCCL finds no verbs device and falls back to TCP sockets.

    uverbs* (verbs) and rdma_cm (connection manager) are what NCCL's IB/RoCE transport opens; umad*/issm*
    (subnet management) are left out: a serving process has no business sending management packets.
    """
    if node is None:
        return ()
    return tuple(d for d in devices
                 if d == "rdma_cm" or (d.startswith("uverbs") and d[6:].isdigit()))


@dataclass(frozen=True)
class Watchdog:
    """The instance's probe (vllm_fleet.host.watchdog on the host), from the inventory's `watchdog`."""

    interval_s: int
    timeout_s: int
    failures: int
    # an instance that has not served since it started is not counted against before this
    grace_s: int
    # systemd IPAddressAllow= of the probe: loopback and the host's own addresses, which is where any
    # config of this host binds (the probe reads host and port from the live config each time, so a
    # rollback to another config is probed as it is)
    allow: tuple[str, ...]

    @property
    def bound_s(self) -> int:
        """About the longest a hung engine goes unnoticed once probes start failing (each probe also
        takes a moment to start)."""
        return self.failures * (self.interval_s + self.timeout_s)

    @property
    def window_s(self) -> int:
        """Failures older than this are forgotten: the bound with room for slow probe starts."""
        return 2 * self.bound_s + 10


def watchdog_of(inst: InstanceSpec, ready_timeout_s: int, bind: str, interfaces: Mapping[str, str],
                node: NodeRole | None) -> Watchdog | None:
    w = inst.watchdog
    if not w.enabled or (node is not None and not node.is_head):
        return None
    local = set(interfaces)
    with contextlib.suppress(ValueError):  # a host name resolves to one of the host's own addresses
        local.add(str(ipaddress.ip_address(probe_address(bind))))
    allow = ("localhost", *sorted(a for a in local if not ipaddress.ip_address(a).is_loopback))
    return Watchdog(w.interval_s, w.timeout_s, w.failures, ready_timeout_s, allow)


def cluster_environment(host: str, node: NodeRole, accelerator: str,
                        interfaces: Mapping[str, str]) -> dict[str, str]:
    """VLLM_HOST_IP and the interface gloo/NCCL use: without them a node resolves its own name (often
    127.0.1.1 in /etc/hosts) and its peers fail to connect."""
    iface = interfaces.get(node.address)
    if iface is None:
        have = ", ".join(f"{a} on {i}" for a, i in sorted(interfaces.items())) or "none read"
        raise SpecError([f"{host}: vllm.cluster.address: {node.address} is not an address of this host "
                         f"(it has {have})"])
    env = {"VLLM_HOST_IP": node.address, "GLOO_SOCKET_IFNAME": iface}
    if accelerator == "cuda":
        env["NCCL_SOCKET_IFNAME"] = iface
    return env


def unit_environment(host: str, accelerator: str, inst: InstanceSpec, gpus: Sequence[Gpu],
                     interfaces: Mapping[str, str], ip_filtering: bool, node: NodeRole | None, *,
                     guarded: bool, warnings: list[str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """(the unit's non-secret environment, its IPAddressAllow= or empty): every source is on the host's
    disk before the restart, so nothing asks a hub at start; a node's sockets go over the cluster's
    interface, and its unit only talks to the other nodes where the API does not listen openly."""
    f = inst.flags
    env = {
        "HOME": STATE_DIR,
        "HF_HOME": HF_HOME,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # keeps vLLM's internal sockets on loopback on a single node
        "VLLM_HOST_IP": "127.0.0.1",
    }
    ip_allow: tuple[str, ...] = ()
    if node is not None:
        env.update(cluster_environment(host, node, accelerator, interfaces))
        if node.is_head and not is_loopback(f.host):
            warnings.append(f"{host}: vllm.instances[{inst.name}]: the API listens on {f.host}, so the unit "
                            "cannot be limited to the cluster's addresses; firewall port "
                            f"{node.master_port} (the head's torch.distributed store, no authentication) "
                            "to the nodes")
        else:
            ip_allow = ("localhost", *node.addresses)
            if not ip_filtering:
                warnings.append(f"{host}: vllm.instances[{inst.name}]: no cgroup v2 here, so systemd cannot "
                                f"enforce the unit's IPAddressAllow=; firewall vLLM's internal ports (store "
                                f"{node.master_port} on the head) to the nodes of cluster {node.cluster}")
    env["HF_HUB_OFFLINE"] = "1"
    if accelerator == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid or str(g.index) for g in gpus)
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(inst.cpu_kvcache_gib)
    env.update(inst.env)
    if guarded:
        env.update(PYTHONPATH=KEYGUARD_DIR, VLLM_FLEET_OPEN_PATHS=",".join(inst.open_paths))
    return env, ip_allow
