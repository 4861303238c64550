"""Stage a model directory from the controller to the host: weights never come from a hub at run time."""

from __future__ import annotations

from pathlib import Path

from pyinfra.operations import files

from fleet.plan import InstancePlan


def stage(inst: InstancePlan) -> list:
    """One put per file: pyinfra compares checksums, so an unchanged model uploads nothing."""
    if not inst.stage_from:
        return []
    src = Path(inst.stage_from)
    ops = [files.directory(name=f"model dir {inst.model_dir}", path=inst.model_dir, user="vllm",
                           group="vllm", mode="750")]
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        ops.append(files.put(name=f"model file {f.name}", src=str(f), dest=f"{inst.model_dir}/{f.name}",
                             user="vllm", group="vllm", mode="640"))
    return ops
