"""Stage a model directory from the controller to the host: weights never come from a hub at run time."""

from __future__ import annotations

from pathlib import Path

from fleet.plan import InstancePlan
from roles.ops import stale, synced_files


def stage(inst: InstancePlan) -> bool:
    """Checksums compared in one remote command: an unchanged model uploads nothing.

    The model directory itself is created by the upload (mkdir -p) under /var/lib/vllm/models.
    """
    if not inst.stage_from:
        return False
    pairs = files(inst)
    if not stale(pairs, "vllm", "vllm", "640"):
        return False
    synced_files(name=f"model files {inst.model_dir}", files=pairs, user="vllm", group="vllm", mode="640")
    return True


def files(inst: InstancePlan) -> list[tuple[str, str]]:
    """(controller file, host path) of a staged model; empty when the model is not staged."""
    if not inst.stage_from:
        return []
    src = Path(inst.stage_from)
    return [(str(f), f"{inst.model_dir}/{f.name}") for f in sorted(p for p in src.iterdir() if p.is_file())]
