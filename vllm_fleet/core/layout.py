"""Where everything lives on a vLLM host: one definition of each path the planner, the roles, the
templates and the status read (the host-side scripts, stdlib only, keep copies that a test holds equal).
"""

from __future__ import annotations

import hashlib

from vllm_fleet.core.spec import VLLM_WRITABLE

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
# the stdlib-only scripts that run on hosts (hoststate, the validator, the watchdog)
HOST_TOOLS = "/usr/local/lib/vllm-fleet"
SYSTEMD_DIR = "/etc/systemd/system"  # the units and drop-ins this toolkit writes
UV_PATH = "/usr/local/bin/uv"  # vllm_fleet/host/hoststate.py's UV: host-side scripts import nothing of ours
HOST_PYTHON = "/usr/bin/python3"  # the OS's python3: host scripts, and the base of every release's venv
# vllm_fleet/host/keyguard.py, alone in its directory (the unit's PYTHONPATH, so nothing else becomes
# importable), loaded by vLLM's --middleware for every instance with a key
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


def unit_name(instance: str) -> str:
    """The systemd unit of an instance: the deploy writes it, status, logs and smoke tests read it."""
    return f"vllm-{instance}.service"
