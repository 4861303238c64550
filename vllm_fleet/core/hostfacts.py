"""What the roles' pyinfra facts return, as types the roles, the controller and the pure core share.

The facts themselves (the remote command and its parsing) are the roles' (vllm_fleet.roles.facts,
.nvidia_facts, .remote, .ops); these are only their answers' shapes, so that the core (HostPorts.from_fact)
and the controller's run state (FleetRun) can name them without importing a role. A fact whose command
cannot run at all answers pyinfra's default (None), as pyinfra's own facts do.
"""

from __future__ import annotations

from typing import Any, TypedDict

from vllm_fleet.core.gpuhealth import HealthReport
from vllm_fleet.core.gpus import DriverVersion, Gpu, NvidiaProblem


class ListenerFacts(TypedDict):
    """One TCP listener of ``ss -ltnp``, with the systemd unit of its process (vllm_fleet.core.startup
    Listener reads it)."""

    address: str
    port: int
    process: str | None
    pid: int | None
    unit: str | None


class VllmHostFacts(TypedDict):
    """The VllmHost fact (vllm_fleet.roles.facts.VllmHost), which documents each key."""

    releases: list[str]
    current: str | None
    cpu_flags: list[str]
    units: list[str]
    unit_states: dict[str, dict[str, str]]  # unit -> its `systemctl show` properties
    watchdogs: dict[str, dict[str, str]]  # timer -> ActiveState, UnitFileState
    base_ok: bool
    state: dict[str, Any] | None  # /var/lib/vllm-fleet/state.json as JSON (vllm_fleet.host.hoststate)
    uv: str | None
    created: list[str]
    python: list[str]  # [version, machine, glibc] of the host's python3; [] without one
    locks: dict[str, str]  # release -> its lock's digest
    interfaces: dict[str, str]  # address -> interface
    ip_filtering: bool
    unprivileged_port_start: int | None
    listeners: list[ListenerFacts] | None
    leftovers: list[str]


class NvidiaGpusFacts(TypedDict):
    """The NvidiaGpus fact (vllm_fleet.roles.nvidia_facts.NvidiaGpus), which documents each key."""

    gpus: list[Gpu]
    driver: DriverVersion | None
    driver_source: str | None
    fields: str | None
    problem: NvidiaProblem | None
    notice: NvidiaProblem | None
    health: HealthReport | None
    rdma_devices: tuple[str, ...]


class HostModelFacts(TypedDict, total=False):
    """The HostModel fact: a host_path model's config.json and weight size; {} when it cannot be read."""

    config: dict[str, Any] | None  # config.json as JSON
    weight_bytes: int | None


class HubCacheFacts(TypedDict):
    """The HubCache fact: a hub snapshot's files on the host and the cache's free space."""

    present: dict[str, int]  # path in the snapshot -> size
    free: int | None
    fs_path: str | None


class LoginFacts(TypedDict):
    """The LoginAccess fact: who the login is and whether it can become root without a password."""

    user: str
    uid: int
    home: str
    sudo: str  # "root", "ok", "no" or "absent"
    sudo_says: str


# The Manifest fact: path -> (sha256, or a secret file's HMAC marker or "unverified"; owner; group; mode),
# None for a path that is not a regular file.
FileSummary = tuple[str, str, str, str]
ManifestFacts = dict[str, FileSummary | None]
