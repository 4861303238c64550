"""Stage a model directory from the controller to the host: weights never come from a hub at run time.

Each content version gets its own directory (vllm_fleet.core.plan.model_version_dir), written by root and only
readable by the vllm group: a new version never overwrites the weights the previous config (and so a
rollback) names, and nothing the vllm user can write is on root's path.
"""

from __future__ import annotations

from pathlib import Path

from vllm_fleet.core.layout import MODELS_DIR, model_digest
from vllm_fleet.core.plan import InstancePlan
from vllm_fleet.roles.ops import sha256, stale, synced_files

OWNER, GROUP, MODE = "root", "vllm", "640"
# beside the models, so a large upload fills the models' file system, not /, and the final mv is a rename
STAGING = f"{MODELS_DIR}/.staging"


def stage(inst: InstancePlan) -> bool:
    """Checksums compared in one remote command: an unchanged model uploads nothing."""
    if not inst.stage_from:
        return False
    pairs = files(inst)
    if not stale(pairs, OWNER, GROUP, MODE):
        return False
    synced_files(name=f"model files {inst.model_dir}", files=pairs, user=OWNER, group=GROUP, mode=MODE,
                 staging_dir=STAGING)
    return True


def source_files(path: str) -> list[Path]:
    src = Path(path)
    return sorted(p for p in src.iterdir() if p.is_file())


def odd_names(path: str) -> list[str]:
    """File names with control characters (a newline, a tab, an escape): no model loader reads such
    a file, and a name with a newline would split the line-based records the host reads back."""
    return [repr(f.name) for f in source_files(path)
            if any(ord(c) < 32 or ord(c) == 127 for c in f.name)]


def digest(path: str) -> str:
    """The content version of a controller model directory (hashes cached across runs by
    vllm_fleet.roles.ops)."""
    return model_digest([(f.name, sha256(str(f))) for f in source_files(path)])


def files(inst: InstancePlan) -> list[tuple[str, str]]:
    """(controller file, host path) of a staged model; empty when the model is not staged."""
    if not inst.stage_from:
        return []
    return [(str(f), f"{inst.model_dir}/{f.name}") for f in source_files(inst.stage_from)]
