"""The pre-deploy report of `vllm-fleet plan`: what each host would get and why, before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.core.tables import columns


@dataclass
class PlanRow:
    host: str
    accelerator: str
    gpus: str = "-"
    driver: str = "-"
    variant: str = "-"
    reason: str = ""
    proof: str = ""  # Variant.proof_line of the build it would install
    release: str = "-"
    lock: str = "-"  # the release's lock digest (vllm_fleet/core/lock.py)
    target: str = ""
    instances: list[str] = field(default_factory=list)
    install: str = ""
    refused: str = ""
    warnings: list[str] = field(default_factory=list)


def gpu_summary(gpus) -> str:
    """'2x NVIDIA A100-SXM4-80GB (8.0, 80 GiB)', grouped by model."""
    if not gpus:
        return "-"
    groups: dict[tuple, int] = {}
    for g in gpus:
        key = (g.name, g.compute_capability, round(g.memory_mib / 1024))
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{n}x {name} ({cc[0]}.{cc[1]}, {mem} GiB)" for (name, cc, mem), n in groups.items())


def table(rows: list[PlanRow]) -> str:
    head = ("HOST", "ACCEL", "GPUS", "DRIVER", "VARIANT", "RELEASE", "LOCK", "INSTANCES (TP, dtype)")
    body = [(r.host, r.accelerator, r.gpus, r.driver, r.variant, r.release, r.lock,
             "; ".join(r.instances) if not r.refused else "REFUSED") for r in rows]
    lines = columns(head, body).splitlines()
    for r in rows:
        lines.append("")
        if r.refused:
            lines.append(f"{r.host}: refused: {r.refused}")
            continue
        lines.append(f"{r.host}: {r.variant} because {r.reason}")
        if r.proof:
            lines.append(f"{r.host}: {r.proof}")
        lines.append(f"{r.host}: lock: {r.lock} for {r.target}")
        lines.append(f"{r.host}: install: {r.install}")
        lines += [f"{r.host}: warning: {w}" for w in r.warnings]
    return "\n".join(lines)
