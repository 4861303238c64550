"""Which GPUs an instance gets, and whether they may serve: the planner's first step for a CUDA host.

Pure, from the parsed nvidia-smi (vllm_fleet.core.gpus) and the GPU health report
(vllm_fleet.core.gpuhealth).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.spec import InstanceSpec, SpecError

if TYPE_CHECKING:
    from vllm_fleet.core.gpuhealth import HealthReport


def choose_dtype(accelerator: str, gpus: Sequence[Gpu], cpu_flags: frozenset[str]) -> str:
    """bf16 needs compute capability 8.0 (Ampere); on CPU it needs AVX-512 BF16/AMX or AVX2's fallback."""
    if accelerator == "cuda":
        return "bfloat16" if gpus and min(g.compute_capability for g in gpus) >= (8, 0) else "float16"
    if cpu_flags & {"avx512_bf16", "amx_bf16", "avx2", "avx512f"} or not cpu_flags:
        return "bfloat16"
    return "float32"


def _left_out_note(gpus: Sequence[Gpu], left_out: Mapping[int, str]) -> str:
    return "; ".join(f"{g.label} is left out: {left_out[g.index]}" for g in gpus if g.index in left_out)


def instance_gpus(host: str, inst: InstanceSpec, gpus: Sequence[Gpu], taken: set[int],
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


def check_gpu_health(host: str, inst: InstanceSpec, gpus: Sequence[Gpu], report: HealthReport | None,
                     host_gpus: Sequence[Gpu], units: frozenset[str], warnings: list[str]) -> None:
    """Refuse a new instance on a GPU with uncorrectable errors (vllm_fleet.core.gpuhealth.verdict), or warn.

    Why an instance already on the host (its unit exists) only gets a warning: it is serving now, and
    refusing its redeploy would neither drain nor fix the GPU; the warning says what to do.
    """
    if report is None or not gpus:
        return
    where = f"{host}: vllm.instances[{inst.name}].gpus"
    deployed = f"vllm-{inst.name}.service" in units
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
        healthy = [g.index for g in host_gpus if g.index not in mine and not report.verdict(g).refusals]
        hint = f"; or give the instance other GPUs (`gpus`; without such errors here: {healthy})" \
            if healthy else ""
        raise SpecError([*refusals[:-1], refusals[-1] + hint])


def check_gpu_minors(host: str, inst: InstanceSpec, gpus: Sequence[Gpu]) -> None:
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
