"""spec + facts -> Plan. Pure: no I/O, so every rule here is unit-tested in milliseconds.

The plan is the single place where derived values are decided (variant, release, tensor-parallel size,
dtype, CUDA_VISIBLE_DEVICES, the final flag set, the unit's environment). Templates only print it, and
roles only apply it, so what `vllm-fleet plan` shows is exactly what a deploy writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.environment import (
    Watchdog,
    index_settings,
    is_loopback,
    missing_secrets,
    rdma_devices,
    unit_environment,
    watchdog_of,
)
from vllm_fleet.core.flags import SHUTDOWN_TIMEOUT_S, render_flags, version_tuple
from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.gpuselect import check_gpu_health, check_gpu_minors, choose_dtype, instance_gpus
from vllm_fleet.core.hub import TOKEN_SUFFIX, HubSnapshot
from vllm_fleet.core.layout import (
    CONFIG_DIR,
    KEYGUARD,
    RELEASES_DIR,
    model_digest,
    model_version_dir,
    unit_name,
)
from vllm_fleet.core.lock import IndexSettings
from vllm_fleet.core.modelinfo import ModelInfoError, from_config
from vllm_fleet.core.parallel import instance_parallel
from vllm_fleet.core.sizing import estimate, estimate_cpu
from vllm_fleet.core.spec import HostSpec, InstanceSpec, SpecError
from vllm_fleet.core.startup import startup_refusals
from vllm_fleet.core.variants import unusable_gpus

if TYPE_CHECKING:
    from vllm_fleet.core.gpuhealth import HealthReport
    from vllm_fleet.core.gpus import DriverVersion, NvidiaProblem
    from vllm_fleet.core.startup import HostPorts
    from vllm_fleet.core.variants import VariantChoice


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


def preflight(host: str, inst: InstanceSpec, accelerator: str, gpus: Sequence[Gpu], tp: int, dtype: str,
              model_config: Mapping[str, Any] | None, weights: int | None, *, max_tp: int | None = None,
              host_gpus: int | None = None, tp_multiple: int = 1,
              vllm_version: str | None = None) -> str | None:
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
                    enforce_eager=f.enforce_eager, gpu_name=gpus[0].name,
                    compute_capability=gpus[0].compute_capability,
                    gb10_small=vllm_version is None or version_tuple(vllm_version) >= (0, 33))
    return None if gest.fits else gest.refusal(host, inst.name, host_gpus=host_gpus)


def _plan_instance(host: str, spec: HostSpec, inst: InstanceSpec, facts: HostFacts,
                   environ: Mapping[str, str], model_config: Mapping[str, Any] | None,
                   taken: set[int], warnings: list[str], weights: int | None = None,
                   node: NodeRole | None = None, left_out: Mapping[int, str] | None = None,
                   digest: str | None = None, hub: HubSnapshot | None = None) -> InstancePlan:
    """One instance, step by step: its secrets and model, its GPUs, its parallelism, the memory
    preflight, its flags, its unit's environment, then what vLLM itself would refuse at start-up."""
    f = inst.flags
    secret_env = _check_access(host, inst, environ, hub, warnings)
    if inst.model.hf_repo and hub is not None:
        model_config, weights = hub.config, hub.weight_bytes  # None while unresolved (status, rollback)

    gpus: list[Gpu] = []
    if spec.accelerator == "cuda":
        gpus = instance_gpus(host, inst, facts.gpus, taken, left_out)
    given = len(gpus)
    tp, pp, local = instance_parallel(host, inst, spec.accelerator, given, node, model_config, warnings)
    if spec.accelerator == "cuda":
        if local < given and inst.gpus is not None:
            warnings.append(f"{host}: vllm.instances[{inst.name}]: tensor {tp} x pipeline {pp} uses {local} "
                            f"of the {given} GPUs it was given; the other {given - local} stay free")
        gpus = gpus[:local]
        taken.update(g.index for g in gpus)
        check_gpu_health(host, inst, gpus, facts.gpu_health, facts.gpus, facts.units, warnings)
        check_gpu_minors(host, inst, gpus)

    dtype = f.dtype or choose_dtype(spec.accelerator, gpus, facts.cpu_flags)
    _check_memory(host, spec, inst, facts, gpus, given, tp, pp, dtype, model_config, weights, node, left_out)
    model_dir, stage_from = _model_source(host, inst, digest, hub)
    flags = _serve_flags(spec, inst, model_dir, dtype, tp, pp, node)
    env, ip_allow = unit_environment(host, spec.accelerator, inst, gpus, facts.interfaces,
                                     facts.ip_filtering, node, guarded=flags.get("middleware") == KEYGUARD,
                                     warnings=warnings)
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
        rdma_devices=rdma_devices(facts.rdma_devices, node) if spec.accelerator == "cuda" else (),
        shutdown_timeout=f.shutdown_timeout if f.shutdown_timeout is not None else SHUTDOWN_TIMEOUT_S,
        node=node, ip_allow=ip_allow, pipeline_parallel=pp,
        watchdog=watchdog_of(inst, spec.ready_timeout_s, f.host, facts.interfaces, node),
        hub=hub, hub_token_env=inst.hf_token_env if hub is not None else None,
    )


def _check_access(host: str, inst: InstanceSpec, environ: Mapping[str, str], hub: HubSnapshot | None,
                  warnings: list[str]) -> dict[str, str]:
    """The controller's secrets the instance needs, and who may reach it; returns the unit's secret
    variables (host variable -> controller variable). The HF token is the fetch's
    (InstancePlan.hub_token_env): vLLM serves a fetched snapshot offline."""
    where = f"{host}: vllm.instances[{inst.name}]"
    f = inst.flags
    problems = []
    secret_env = {"VLLM_API_KEY": inst.api_key_env} if inst.api_key_env else {}
    if inst.model.hf_repo:
        if hub is None:
            raise SpecError([f"{where}.model.hf_repo: {inst.model.hf_repo} was not resolved to a commit "
                             "(the controller reads the hub at plan time)"])
        url = urlsplit(hub.endpoint)
        if inst.hf_token_env and url.scheme == "http" and not is_loopback(url.hostname or ""):
            warnings.append(f"{where}.hf_token_env: the token goes to {hub.endpoint} over plain http, "
                            "readable on the network; use https")
    elif inst.hf_token_env:
        warnings.append(f"{where}.hf_token_env: {inst.hf_token_env} is not used: the model is not from a "
                        "hub (hf_repo)")
    problems.extend(missing_secrets(host, inst, environ))
    if inst.api_key_env is None and not is_loopback(f.host) and not inst.port_protected_elsewhere:
        problems.append(f"{where}.flags.host: {f.host} is reachable from the network and no API key is set; "
                        "set api_key_env, bind 127.0.0.1, or set port_protected_elsewhere: true")
    if problems:
        raise SpecError(problems)
    return secret_env


def _check_memory(host: str, spec: HostSpec, inst: InstanceSpec, facts: HostFacts, gpus: Sequence[Gpu],
                  given: int, tp: int, pp: int, dtype: str, model_config: Mapping[str, Any] | None,
                  weights: int | None, node: NodeRole | None, left_out: Mapping[int, str] | None) -> None:
    """The memory preflight with the ways out this instance has: the TPs its own GPUs per stage allow
    (a node's; every node's for a tensor split)."""
    staged = inst.model_copy(update={"flags": inst.flags.model_copy(update={"pipeline_parallel_size": pp})})
    tp_multiple, host_gpus = 1, None
    if node is None:
        max_tp, host_gpus = given // pp, len(facts.gpus) - len(left_out or {})
    elif node.split == "tensor":
        max_tp, tp_multiple = node.nnodes * given, node.nnodes
    else:
        max_tp = given
    refusal = preflight(host, staged, spec.accelerator, gpus, tp, dtype, model_config, weights,
                        max_tp=max_tp, host_gpus=host_gpus, tp_multiple=tp_multiple,
                        vllm_version=spec.version)
    if refusal:
        raise SpecError([refusal])


def _model_source(host: str, inst: InstanceSpec, digest: str | None,
                  hub: HubSnapshot | None) -> tuple[str, str | None]:
    """(the weights' directory on the host, the controller directory staged there or None)."""
    if inst.model.path:
        if not digest:
            raise SpecError([f"{host}: vllm.instances[{inst.name}].model.path: no content digest of "
                             f"{inst.model.path} (the controller hashes the files it stages)"])
        return model_version_dir(inst.model.name, digest), inst.model.path
    if inst.model.host_path:
        return inst.model.host_path, None
    assert hub is not None
    return hub.directory, None


def _serve_flags(spec: HostSpec, inst: InstanceSpec, model_dir: str, dtype: str, tp: int, pp: int,
                 node: NodeRole | None) -> dict[str, Any]:
    """The `vllm serve` flags: the inventory's, with what the planner decided, rendered for the release
    (a flag it lacks is never emitted)."""
    f = inst.flags
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
        updates["block_size"] = 16  # the project's starting value on CUDA; CPU keeps vLLM's own (128)
    flags = render_flags(f.model_copy(update=updates), spec.version, spec.accelerator)
    # vLLM's own key check skips /invocations and more: the guard covers every route but the open ones
    if inst.api_key_env is not None and (node is None or node.is_head):
        flags["middleware"] = KEYGUARD
    return flags
