"""Where the controller keeps what it downloads and remembers between runs.

The controller is an operator's workstation or a CI runner as often as it is root on a jump host, so the
cache follows the user: root gets the system cache directory, anyone else their XDG cache. The host's
paths live with the plan that uses them (vllm_fleet/core/plan.py), and the host-side scripts carry their own
copy,
checked equal by a unit test, because they import nothing of ours.
"""

from __future__ import annotations

import os
from pathlib import Path


def controller_cache(environ: dict[str, str] | os._Environ[str] = os.environ, uid: int | None = None) -> Path:
    """VLLM_FLEET_CACHE when set; /var/cache/vllm-fleet for root; else $XDG_CACHE_HOME/vllm-fleet."""
    if environ.get("VLLM_FLEET_CACHE"):
        return Path(environ["VLLM_FLEET_CACHE"])
    if (os.geteuid() if uid is None else uid) == 0:
        return Path("/var/cache/vllm-fleet")
    xdg = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(xdg) / "vllm-fleet"


CACHE_DIR = controller_cache()
