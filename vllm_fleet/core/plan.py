"""spec + facts -> Plan. Pure: no I/O, so every rule here is unit-tested in milliseconds.

The plan is the single place where derived values are decided (variant, release, tensor-parallel size,
dtype, CUDA_VISIBLE_DEVICES, the final flag set, the unit's environment). Templates only print it, and
roles only apply it, so what `vllm-fleet plan` shows is exactly what a deploy writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.flags import SHUTDOWN_TIMEOUT_S, render_flags
from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.hub import HF_HOME, TOKEN_SUFFIX, HubSnapshot
from vllm_fleet.core.lock import IndexSettings, settings_for
from vllm_fleet.core.modelinfo import ModelInfoError, from_config
from vllm_fleet.core.sizing import estimate, estimate_cpu
from vllm_fleet.core.spec import VLLM_WRITABLE, HostSpec, InstanceSpec, SpecError
from vllm_fleet.core.startup import startup_refusals
from vllm_fleet.core.variants import unusable_gpus
from vllm_fleet.host.watchdog import probe_address

if TYPE_CHECKING:
    from vllm_fleet.core.flags import ServeFlags
    from vllm_fleet.core.gpuhealth import HealthReport
    from vllm_fleet.core.gpus import DriverVersion, NvidiaProblem
    from vllm_fleet.core.startup import HostPorts
    from vllm_fleet.core.variants import Variant, VariantChoice

RELEASES_DIR = "/opt/vllm/releases"
CURRENT_LINK = "/opt/vllm/current"
# Staged models, one directory per content digest: root writes them, the vllm group only reads, so the
# process a model or an engine bug controls can neither plant a link root would follow nor change the
# weights a rollback returns to.
MODELS_DIR = "/opt/vllm/models"
# The vllm user's own home (HF cache, compile caches): root never acts inside it.
STATE_DIR = VLLM_WRITABLE
VLLM_USER = "vllm"  # who runs vLLM, owns STATE_DIR, and does whatever happens inside it
CONFIG_DIR = "/etc/vllm"
FLEET_STATE = "/var/lib/vllm-fleet"
STAGED = f"{FLEET_STATE}/staged"  # configs validated before the switch, and what validation found
SUMS = f"{FLEET_STATE}/sums.json"  # checksums of the files the deploy wrote (roles/ops.py)
# One store of wheels per host, kept between releases at a fixed path (see vllm_fleet/controller/wheels.py)
HOST_WHEELS = "/var/cache/vllm-fleet/wheels"
# the stdlib-only scripts from fleet/ that run on hosts (hoststate, the validator, the watchdog)
HOST_TOOLS = "/usr/local/lib/vllm-fleet"
UV_PATH = "/usr/local/bin/uv"  # vllm_fleet/host/hoststate.py's UV: host-side scripts import nothing of ours
HOST_PYTHON = "/usr/bin/python3"  # the OS's python3: host scripts, and the base of every release's venv
# vllm_fleet/host/keyguard.py, alone in its directory (the unit's PYTHONPATH, so nothing else becomes
# importable),
# loaded by vLLM's --middleware for every instance with a key
KEYGUARD_DIR = f"{HOST_TOOLS}/asgi"
KEYGUARD_MODULE = "vllm_fleet_keyguard"
KEYGUARD = f"{KEYGUARD_MODULE}.KeyGuard"
# Directories every vLLM host needs: path -> "owner:group:mode" (as `stat -c %U:%G:%a` prints it).
BASE_DIRS = {
    RELEASES_DIR: "root:root:755",
    CONFIG_DIR: "root:root:755",
    STATE_DIR: "vllm:vllm:750",
    MODELS_DIR: "root:vllm:750",
    FLEET_STATE: "root:root:700",
}


def model_digest(files: list[tuple[str, str]]) -> str:
    """A staged model's version: (file name, sha256) of each file, so a rollback's config names
    weights that are still there, unchanged."""
    h = hashlib.sha256()
    for name, sha in sorted(files):
        h.update(f"{name}\0{sha}\n".encode())
    return h.hexdigest()[:16]


def model_version_dir(name: str, digest: str) -> str:
    return f"{MODELS_DIR}/{name}/{digest}"


@dataclass(frozen=True)
class HostFacts:
    """What the planner needs to know about a host, gathered read-only beforehand."""

    gpus: tuple[Gpu, ...] = ()
    driver: DriverVersion | None = None
    nvidia_problem: NvidiaProblem | None = None
    cpu_flags: frozenset[str] = frozenset()
    # IPv4/IPv6 address -> interface name (ip -o addr), for a cluster node's sockets
    interfaces: Mapping[str, str] = field(default_factory=dict)
    # systemd can enforce IPAddressAllow= (cgroup v2)
    ip_filtering: bool = True
    # who listens on which port, the lowest unprivileged port; None: not read
    ports: HostPorts | None = None
    # ECC errors, row remaps, throttling and Xids per GPU; None: not read
    gpu_health: HealthReport | None = None
    # the host's vllm-*.service units: an instance whose unit exists is already deployed there
    units: frozenset[str] = frozenset()
    # entries of /dev/infiniband (vllm_fleet.roles.nvidia_facts.NvidiaGpus "rdma_devices"); empty: no RDMA
    rdma_devices: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class InstancePlan:
    name: str
    unit: str
    config_path: str
    env_path: str
    served_name: str
    model_dir: str  # where the weights are on the host
    stage_from: str | None  # controller directory to copy to model_dir
    flags: dict[str, Any]
    environment: dict[str, str]
    # variable on the host -> controller environment variable it is read from
    secret_env: dict[str, str]
    tensor_parallel: int
    dtype: str
    gpu_indexes: tuple[int, ...]
    host: str
    port: int
    shutdown_timeout: int
    node: NodeRole | None = None
    # systemd IPAddressAllow= for the unit (with IPAddressDeny=any); empty: no address filter
    ip_allow: tuple[str, ...] = ()
    pipeline_parallel: int = 1
    # None: no probe (turned off, or a node group's worker, which has no API)
    watchdog: Watchdog | None = None
    # the N of each GPU's /dev/nvidiaN (DeviceAllow=), in gpu_indexes' order: not the index itself
    gpu_minors: tuple[int, ...] = ()
    # /dev/infiniband nodes the unit allows (a cluster node's NCCL over RDMA); non-empty also raises
    # LimitMEMLOCK, since verbs pin their buffers
    rdma_devices: tuple[str, ...] = ()
    # an hf_repo model: the commit fetched into model_dir before the restart, and the controller variable
    # holding the token the fetch uses (roles/hub.py)
    hub: HubSnapshot | None = None
    hub_token_env: str | None = None

    @property
    def watchdog_units(self) -> tuple[str, str]:
        """(service, timer): instance files of one name outside `vllm-*.service` without an `@`, which
        the toolkit reads as its instances."""
        return f"vllm-watchdog@{self.name}.service", f"vllm-watchdog@{self.name}.timer"

    @property
    def api_key_required(self) -> bool:
        return "VLLM_API_KEY" in self.secret_env

    @property
    def key_guarded(self) -> bool:
        """The validator must find the key guard loaded: every keyed instance with an API (a node
        group's headless worker has none, so vLLM parses no middleware there)."""
        return self.flags.get("middleware") == KEYGUARD

    @property
    def environment_path(self) -> str:
        """The unit's non-secret environment, 0600 like the keys (a proxy URL may hold a password) but
        snapshotted with config and unit, so a rollback restores it; the keys' file never is."""
        return self.config_path.removesuffix(".yaml") + ".environment"

    @property
    def hub_token_path(self) -> str:
        """The fetch's token, 0600 root, beside the env file the unit reads (never this one)."""
        return self.config_path.removesuffix(".yaml") + TOKEN_SUFFIX


@dataclass(frozen=True)
class HostPlan:
    host: str
    vllm_version: str
    variant: str
    variant_reason: str
    release: str
    release_dir: str
    install_source: str
    install_spec: VariantChoice
    keep_releases: int
    ready_timeout_s: int
    instances: tuple[InstancePlan, ...]
    warnings: tuple[str, ...] = field(default=())
    # where the release's lock is resolved from (and, in registry mode, installed from)
    index: IndexSettings = field(default=IndexSettings())


def unit_name(instance: str) -> str:
    """The systemd unit of an instance: the deploy writes it, status, logs and smoke tests read it."""
    return f"vllm-{instance}.service"


def _is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


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


def choose_dtype(accelerator: str, gpus: Sequence[Gpu], cpu_flags: frozenset[str]) -> str:
    """bf16 needs compute capability 8.0 (Ampere); on CPU it needs AVX-512 BF16/AMX or AVX2's fallback."""
    if accelerator == "cuda":
        return "bfloat16" if gpus and min(g.compute_capability for g in gpus) >= (8, 0) else "float16"
    if cpu_flags & {"avx512_bf16", "amx_bf16", "avx2", "avx512f"} or not cpu_flags:
        return "bfloat16"
    return "float32"


def _left_out_note(gpus: Sequence[Gpu], left_out: Mapping[int, str]) -> str:
    return "; ".join(f"{g.label} is left out: {left_out[g.index]}" for g in gpus if g.index in left_out)


def _instance_gpus(host: str, inst: InstanceSpec, gpus: Sequence[Gpu], taken: set[int],
                   left_out: Mapping[int, str] | None = None) -> list[Gpu]:
    """The instance's GPUs. A GPU in ``left_out`` (index -> why vLLM cannot use it) is never assigned
    automatically (`gpus` unset = every usable GPU not yet given to another instance; a count = the
    first N of those), and pinning it by index is refused for this instance only."""
    left_out = left_out or {}
    by_index = {g.index: g for g in gpus}
    usable = [g for g in gpus if g.index not in left_out]
    free = [g for g in usable if g.index not in taken]
    note = f" ({_left_out_note(gpus, left_out)})" if left_out else ""
    where = f"{host}: vllm.instances[{inst.name}].gpus"
    if inst.gpus is None:
        chosen = free
    elif isinstance(inst.gpus, int):
        if inst.gpus > len(free):
            of = f"of the {len(usable)} it can use{note}" if left_out else f"of {len(gpus)}"
            raise SpecError([f"{where}: asks for {inst.gpus} GPU(s), the host has {len(free)} free {of}"])
        chosen = free[: inst.gpus]
    else:
        missing = [i for i in inst.gpus if i not in by_index]
        if missing:
            raise SpecError([f"{where}: GPU index {missing} not on this host (has {sorted(by_index)})"])
        bad = [by_index[i] for i in inst.gpus if i in left_out]
        if bad:
            raise SpecError([f"{where}: " + "; ".join(f"{g.label} cannot be used: {left_out[g.index]}"
                                                      for g in bad)
                             + f"; this host's usable GPUs are {[g.index for g in usable]}"])
        overlap = [i for i in inst.gpus if i in taken]
        if overlap:
            raise SpecError([f"{where}: GPU {overlap} already given to another instance"])
        chosen = [by_index[i] for i in inst.gpus]
    if not chosen:
        raise SpecError([f"{where}: no GPU left for this instance{note}"])
    return chosen


def _check_gpu_health(host: str, inst: InstanceSpec, gpus: Sequence[Gpu], facts: HostFacts,
                      warnings: list[str]) -> None:
    """Refuse a new instance on a GPU with uncorrectable errors (vllm_fleet.core.gpuhealth.verdict), or warn.

    Why an instance already on the host (its unit exists) only gets a warning: it is serving now, and
    refusing its redeploy would neither drain nor fix the GPU; the warning says what to do.
    """
    report = facts.gpu_health
    if report is None or not gpus:
        return
    where = f"{host}: vllm.instances[{inst.name}].gpus"
    deployed = f"vllm-{inst.name}.service" in facts.units
    refusals: list[str] = []
    for g in gpus:
        v = report.verdict(g)
        warnings.extend(f"{where}: {w}" for w in v.warnings)
        if deployed:
            warnings.extend(f"{where}: already deployed here, so not refused: {r}" for r in v.refusals)
        else:
            refusals.extend(f"{where}: {r}" for r in v.refusals)
    if not report.xids_read:
        note = (f"{host}: the kernel log could not be read (journalctl -k, dmesg), so GPU Xid errors were "
                "not checked; deploy with a login that may read it (root, sudo, or group systemd-journal)")
        if note not in warnings:
            warnings.append(note)
    if refusals:
        mine = {g.index for g in gpus}
        healthy = [g.index for g in facts.gpus if g.index not in mine and not report.verdict(g).refusals]
        hint = f"; or give the instance other GPUs (`gpus`; without such errors here: {healthy})" \
            if healthy else ""
        raise SpecError([*refusals[:-1], refusals[-1] + hint])


def plan_host(host: str, spec: HostSpec, facts: HostFacts, environ: Mapping[str, str],
              model_configs: Mapping[str, Mapping[str, Any]] | None = None,
              choose_variant=None, weight_bytes: Mapping[str, int | None] | None = None,
              node: NodeRole | None = None, model_digests: Mapping[str, str] | None = None,
              hub: Mapping[str, HubSnapshot] | None = None) -> HostPlan:
    """Decide everything for one host, or raise SpecError naming host and field.

    `model_configs` maps instance name -> the model's config.json (heads for TP, sizes for the memory
    preflight), `weight_bytes` instance name -> the weights' size from the safetensors headers; `hub`
    instance name -> its `hf_repo` model resolved to a commit (vllm_fleet/controller/hub.py);
    `choose_variant` is vllm_fleet.core.variants.choose_variant, injectable for tests; `node` is the host's
    place
    in its node group (vllm_fleet.core.cluster.resolve), None for a stand-alone host.

    Mixed hosts: a GPU that no build of the release can drive here (vllm_fleet.core.variants.unusable_gpus)
    is left
    out with a warning, not a refusal of the host: automatic assignment skips it, only an instance pinned
    to it is refused, and the build is chosen for the GPUs the instances use. A host with no usable GPU
    is refused as before.
    """
    if choose_variant is None:
        from vllm_fleet.core.variants import choose_variant
    model_configs = model_configs or {}
    problems: list[str] = []
    warnings: list[str] = []

    if spec.accelerator == "cuda" and facts.nvidia_problem is not None:
        raise SpecError([facts.nvidia_problem.message(host)])
    all_gpus = list(facts.gpus)
    # GPUs no build can drive are left out rather than refusing the host, unless that is every GPU.
    left_out: dict[int, str] = {}
    choice = None
    try:
        choice = choose_variant(spec.version, spec.accelerator, facts.driver, all_gpus, spec.variant)
    except ValueError as e:
        if spec.accelerator == "cuda":
            left_out = unusable_gpus(spec.version, facts.driver, all_gpus, spec.variant)
        if not left_out or len(left_out) >= len(all_gpus):
            raise SpecError([f"{host}: vllm.variant: {e}"]) from None
    usable = [g.index for g in all_gpus if g.index not in left_out]
    warnings.extend(f"{host}: {g.label} is left out: {left_out[g.index]}; instances with `gpus` unset "
                    f"or a count take only GPUs {usable}" for g in all_gpus if g.index in left_out)

    taken: set[int] = set()
    instances = []
    # the deploy hashes what it stages (roles/model.py); a caller that hashes nothing (the unit
    # tests)
    # gets versions named by the source path
    digests = model_digests if model_digests is not None else {
        i.name: model_digest([("path", str(i.model.path))]) for i in spec.instances if i.model.path}
    for inst in spec.instances:
        try:
            instances.append(_plan_instance(host, spec, inst, facts, environ, model_configs.get(inst.name),
                                            taken, warnings, (weight_bytes or {}).get(inst.name), node,
                                            left_out, digests.get(inst.name), (hub or {}).get(inst.name)))
        except SpecError as e:
            problems.extend(e.problems)
    if problems:
        raise SpecError(problems)
    if spec.accelerator == "cuda":
        # the build is chosen for the GPUs the instances use, not for every GPU of the host
        used = [g for g in all_gpus if g.index in taken]
        if choice is None or len(used) != len(all_gpus):
            try:
                choice = choose_variant(spec.version, spec.accelerator, facts.driver, used, spec.variant)
            except ValueError as e:
                raise SpecError([f"{host}: vllm.variant: {e}"]) from None
    assert choice is not None
    index = index_settings(choice.build, spec, environ)
    if environ.get("VLLM_FLEET_EXTRA_INDEX_URLS"):
        warnings.append(f"{host}: VLLM_FLEET_EXTRA_INDEX_URLS is no longer read: a fleet's indexes are its "
                        "package_index (`vllm-fleet explain package_index`)")
    if spec.install_source == "registry" and index.find_links:
        raise SpecError([f"{host}: vllm.install_source: a registry host installs from the index, but this "
                         f"{choice.variant} build's lock is resolved with the controller's folders "
                         f"{', '.join(index.find_links)} (VLLM_FLEET_FIND_LINKS), which the host cannot "
                         "read: use install_source: cache, or a package_index that holds those wheels"])
    return HostPlan(
        host=host, vllm_version=spec.version, variant=choice.variant, variant_reason=choice.reason,
        release=choice.release_dir, release_dir=f"{RELEASES_DIR}/{choice.release_dir}",
        install_source=spec.install_source, install_spec=choice, keep_releases=spec.keep_releases,
        ready_timeout_s=spec.ready_timeout_s, instances=tuple(instances), warnings=tuple(warnings),
        index=index,
    )


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


def preflight(host: str, inst: InstanceSpec, accelerator: str, gpus: Sequence[Gpu], tp: int, dtype: str,
              model_config: Mapping[str, Any] | None, weights: int | None, *, max_tp: int | None = None,
              host_gpus: int | None = None, tp_multiple: int = 1) -> str | None:
    """Predict an out-of-memory start on the controller (vllm_fleet/core/sizing.py); None when it fits or the
    model's config is not known here.

    The ways out are only what this host allows: a tensor_parallel_size up to ``max_tp`` (the instance's
    GPUs per pipeline stage; default ``tp``), a multiple of ``tp_multiple``; a larger one is said as
    "more GPUs than this instance has", with ``host_gpus`` (the GPUs the host could give it) saying
    whether this host has them.
    """
    if not model_config:
        return None
    try:
        info = from_config(model_config, weights)
    except ModelInfoError:
        return None
    f = inst.flags
    max_len = f.max_model_len or info.default_max_model_len
    if max_len is None:
        return None
    if accelerator == "cpu":
        est = estimate_cpu(info, max_len, f.max_num_seqs, inst.cpu_kvcache_gib, dtype,
                           kv_cache_dtype=f.kv_cache_dtype)
        return None if est.fits else est.refusal(host, inst.name)
    if not gpus:
        return None
    gest = estimate(info, tp=tp, pp=f.pipeline_parallel_size, max_model_len=max_len,
                    max_tp=max(tp, max_tp or tp), tp_multiple=tp_multiple,
                    max_num_seqs=f.max_num_seqs, kv_cache_dtype=f.kv_cache_dtype, dtype=dtype,
                    gpu_memory_total_mib=min(g.memory_mib for g in gpus),
                    gpu_memory_utilization=f.gpu_memory_utilization,
                    max_num_batched_tokens=f.max_num_batched_tokens,
                    enable_chunked_prefill=f.enable_chunked_prefill, block_size=f.block_size,
                    enforce_eager=f.enforce_eager, gpu_name=gpus[0].name)
    return None if gest.fits else gest.refusal(host, inst.name, host_gpus=host_gpus)


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


def _plan_instance(host: str, spec: HostSpec, inst: InstanceSpec, facts: HostFacts,
                   environ: Mapping[str, str], model_config: Mapping[str, Any] | None,
                   taken: set[int], warnings: list[str], weights: int | None = None,
                   node: NodeRole | None = None, left_out: Mapping[int, str] | None = None,
                   digest: str | None = None, hub: HubSnapshot | None = None) -> InstancePlan:
    where = f"{host}: vllm.instances[{inst.name}]"
    f = inst.flags
    problems = []

    # the HF token is the fetch's (InstancePlan.hub_token_env): vLLM serves a fetched snapshot offline
    secret_env = {"VLLM_API_KEY": inst.api_key_env} if inst.api_key_env else {}
    if inst.model.hf_repo:
        if hub is None:
            raise SpecError([f"{where}.model.hf_repo: {inst.model.hf_repo} was not resolved to a commit "
                             "(the controller reads the hub at plan time)"])
        model_config, weights = hub.config, hub.weight_bytes  # None while unresolved (status, rollback)
        url = urlsplit(hub.endpoint)
        if inst.hf_token_env and url.scheme == "http" and not _is_loopback(url.hostname or ""):
            warnings.append(f"{where}.hf_token_env: the token goes to {hub.endpoint} over plain http, "
                            "readable on the network; use https")
    elif inst.hf_token_env:
        warnings.append(f"{where}.hf_token_env: {inst.hf_token_env} is not used: the model is not from a "
                        "hub (hf_repo)")
    problems.extend(missing_secrets(host, inst, environ))
    if inst.api_key_env is None and not _is_loopback(f.host) and not inst.port_protected_elsewhere:
        problems.append(f"{where}.flags.host: {f.host} is reachable from the network and no API key is set; "
                        "set api_key_env, bind 127.0.0.1, or set port_protected_elsewhere: true")
    if problems:
        raise SpecError(problems)

    gpus: list[Gpu] = []
    if spec.accelerator == "cuda":
        gpus = _instance_gpus(host, inst, facts.gpus, taken, left_out)
    given = len(gpus)
    heads = kv_heads = None
    if model_config:
        heads = model_config.get("num_attention_heads")
        kv_heads = model_config.get("num_key_value_heads", heads)
    pp = f.pipeline_parallel_size
    if node is not None:
        tp, pp, local = cluster_parallel(host, inst.name, node, spec.accelerator, len(gpus), f, heads,
                                         kv_heads, warnings)
    else:
        if spec.accelerator == "cuda" and pp > len(gpus):
            raise SpecError([f"{where}.flags.pipeline_parallel_size: {pp} stages need at least {pp} GPUs, "
                             f"the instance has {len(gpus)}"])
        # pipeline stages split the instance's GPUs; tensor parallelism works within a stage
        tp, tp_warn = choose_tensor_parallel(host, inst.name, len(gpus) // pp if gpus else 0,
                                             f.tensor_parallel_size, heads, kv_heads)
        warnings.extend(tp_warn)
        local = tp * pp
        if f.distributed_executor_backend == "uni" and tp * pp > 1:
            # vLLM's UniProcExecutor runs one worker: with more ranks it waits for ranks that never start
            raise SpecError([f"{where}.flags.distributed_executor_backend: 'uni' runs a single worker, but "
                             f"this instance runs tensor {tp} x pipeline {pp}; vLLM would hang at start-up "
                             "waiting for the other ranks: use 'mp' (or leave it unset)"])
    if spec.accelerator == "cuda":
        used = local
        if used < len(gpus) and inst.gpus is not None:
            warnings.append(f"{host}: vllm.instances[{inst.name}]: tensor {tp} x pipeline {pp} uses {used} "
                            f"of the {len(gpus)} GPUs it was given; the other {len(gpus) - used} stay free")
        gpus = gpus[:used]
        taken.update(g.index for g in gpus)
        _check_gpu_health(host, inst, gpus, facts, warnings)
        _check_gpu_minors(host, inst, gpus)

    dtype = f.dtype or choose_dtype(spec.accelerator, gpus, facts.cpu_flags)
    staged = inst.model_copy(update={"flags": f.model_copy(update={"pipeline_parallel_size": pp})})
    # the TPs this instance could take: its own GPUs per stage (a node's; every node's for a tensor split)
    tp_multiple, host_gpus = 1, None
    if node is None:
        max_tp, host_gpus = given // pp, len(facts.gpus) - len(left_out or {})
    elif node.split == "tensor":
        max_tp, tp_multiple = node.nnodes * given, node.nnodes
    else:
        max_tp = given
    refusal = preflight(host, staged, spec.accelerator, gpus, tp, dtype, model_config, weights,
                        max_tp=max_tp, host_gpus=host_gpus, tp_multiple=tp_multiple)
    if refusal:
        raise SpecError([refusal])
    if inst.model.path:
        if not digest:
            raise SpecError([f"{host}: vllm.instances[{inst.name}].model.path: no content digest of "
                             f"{inst.model.path} (the controller hashes the files it stages)"])
        model_dir, stage_from = model_version_dir(inst.model.name, digest), inst.model.path
    elif inst.model.host_path:
        model_dir, stage_from = inst.model.host_path, None
    else:
        assert hub is not None
        model_dir, stage_from = hub.directory, None

    updates: dict[str, Any] = {
        "model": model_dir,
        "served_model_name": f.served_model_name or inst.model.name,
        "dtype": dtype,
    }
    if spec.accelerator == "cuda" or node is not None:
        updates["tensor_parallel_size"] = tp
    if node is not None:
        updates.update(pipeline_parallel_size=pp, distributed_executor_backend="mp", nnodes=node.nnodes,
                       node_rank=node.rank, master_addr=node.head_address, master_port=node.master_port,
                       headless=None if node.is_head else True)
    if spec.accelerator == "cuda" and f.block_size is None:
        updates["block_size"] = 16  # the seed's starting value; CPU keeps vLLM's own (128)
    flags = render_flags(f.model_copy(update=updates), spec.version, spec.accelerator)
    # vLLM's own key check skips /invocations and more: the guard covers every route but the open ones
    guarded = inst.api_key_env is not None and (node is None or node.is_head)
    if guarded:
        flags["middleware"] = KEYGUARD

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
        env.update(cluster_environment(host, node, spec.accelerator, facts.interfaces))
        if node.is_head and not _is_loopback(f.host):
            warnings.append(f"{host}: vllm.instances[{inst.name}]: the API listens on {f.host}, so the unit "
                            "cannot be limited to the cluster's addresses; firewall port "
                            f"{node.master_port} (the head's torch.distributed store, no authentication) "
                            "to the nodes")
        else:
            ip_allow = ("localhost", *node.addresses)
            if not facts.ip_filtering:
                warnings.append(f"{host}: vllm.instances[{inst.name}]: no cgroup v2 here, so systemd cannot "
                                f"enforce the unit's IPAddressAllow=; firewall vLLM's internal ports (store "
                                f"{node.master_port} on the head) to the nodes of cluster {node.cluster}")
    # every source is on the host's disk before the restart: nothing to ask a hub at start
    env["HF_HUB_OFFLINE"] = "1"
    if spec.accelerator == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid or str(g.index) for g in gpus)
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(inst.cpu_kvcache_gib)
    env.update(inst.env)
    if guarded:
        env.update(PYTHONPATH=KEYGUARD_DIR, VLLM_FLEET_OPEN_PATHS=",".join(inst.open_paths))
    refused = startup_refusals(host, inst.name, flags, vllm_version=spec.version,
                               accelerator=spec.accelerator, gpus=gpus, model_config=model_config,
                               cpu_flags=facts.cpu_flags, environment=env, ports=facts.ports)
    if refused:
        raise SpecError(refused)

    return InstancePlan(
        name=inst.name, unit=unit_name(inst.name),
        config_path=f"{CONFIG_DIR}/{inst.name}.yaml", env_path=f"{CONFIG_DIR}/{inst.name}.env",
        served_name=str(flags["served-model-name"]), model_dir=model_dir, stage_from=stage_from,
        flags=flags, environment=env, secret_env=secret_env, tensor_parallel=tp, dtype=dtype,
        gpu_indexes=tuple(g.index for g in gpus), host=f.host, port=f.port,
        gpu_minors=tuple(g.minor for g in gpus if g.minor is not None),
        rdma_devices=rdma_devices(facts, node) if spec.accelerator == "cuda" else (),
        shutdown_timeout=f.shutdown_timeout if f.shutdown_timeout is not None else SHUTDOWN_TIMEOUT_S,
        node=node, ip_allow=ip_allow, pipeline_parallel=pp,
        watchdog=watchdog_of(inst, spec.ready_timeout_s, f.host, facts.interfaces, node),
        hub=hub, hub_token_env=inst.hf_token_env if hub is not None else None,
    )


def _check_gpu_minors(host: str, inst: InstanceSpec, gpus: Sequence[Gpu]) -> None:
    """Refuse GPUs whose device minor is unknown: DeviceAllow=/dev/nvidia<index> would open another GPU
    (or none) wherever the minors are not the indexes, and the unit would fail in CUDA init."""
    unknown = [g for g in gpus if g.minor is None]
    if unknown:
        names = "; ".join(f"{g.label} (PCI {g.pci_bus_id})" for g in unknown)
        raise SpecError([f"{host}: vllm.instances[{inst.name}].gpus: the device minor number (the N of "
                         f"/dev/nvidiaN) of {names} could not be read: neither `nvidia-smi -q` (Minor "
                         "Number) nor /proc/driver/nvidia/gpus/<bus>/information (Device Minor) shows it, "
                         "and the nvidia-smi index is not a safe guess; check that `nvidia-smi -q` runs on "
                         "the host"])


def rdma_devices(facts: HostFacts, node: NodeRole | None) -> tuple[str, ...]:
    """The /dev/infiniband nodes a unit allows: only a cluster node's (one host's GPUs talk over NVLink
    or PCIe, not RDMA), else NCCL finds no verbs device and falls back to TCP sockets.

    uverbs* (verbs) and rdma_cm (connection manager) are what NCCL's IB/RoCE transport opens; umad*/issm*
    (subnet management) are left out: a serving process has no business sending management packets.
    """
    if node is None:
        return ()
    return tuple(d for d in facts.rdma_devices
                 if d == "rdma_cm" or (d.startswith("uverbs") and d[6:].isdigit()))


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
