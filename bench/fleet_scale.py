"""Fleet scale: how the deploy's collection grows with the number of hosts, measured in one run.

  python bench/fleet_scale.py [--hosts 16] [--runs 3]

Boots N light lab hosts (lab20 up: real systemd hosts over real SSH, with vllm data, never deployed),
then times `pyinfra --dry` of the vLLM deploy against one of them and against all N: facts, plan,
render and change detection for every host, nothing executed. Prints the medians and their ratio
(target <= 1.5), and the same for a bare one-fact pyinfra deploy over the same hosts (pyinfra's own
cost of connecting and reading a fact, nothing of ours). Removes the light hosts at the end. Needs root
(the lab).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
INVENTORY = str(ROOT / "fleetlab" / "inventories" / "lab.py")
DEPLOY = "vllm_fleet.roles.vllm.deploy_vllm"
BARE = str(ROOT / "bench" / "bare_fact.py")


def timed(hosts: list[str], deploy: str = DEPLOY) -> float:
    limits = [arg for h in hosts for arg in ("--limit", h)]
    cmd = [PYINFRA, "--dry", *limits, INVENTORY, deploy]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ, timeout=900)
    took = time.monotonic() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} ... failed:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the light hosts up")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab
    from fleetlab.inventory import TINY_MODEL
    from fleetlab.tinymodel import make_tiny_model

    os.environ.setdefault("VLLM_API_KEY", "fleet-scale-bench-key")  # --dry: checked, never sent
    make_tiny_model(TINY_MODEL)
    light = [h for h in lab.up_light(args.hosts) if h.role == "light"]  # up_light lists the whole lab
    names = [h.name for h in light]
    try:
        timed(names)  # warm: the controller's caches (model digest, uv, wheels) and every host's key
        one = statistics.median(timed(names[:1]) for _ in range(args.runs))
        many = statistics.median(timed(names) for _ in range(args.runs))
        # the floor: pyinfra itself connecting and reading one fact per host, nothing of ours
        bare_one = statistics.median(timed(names[:1], BARE) for _ in range(args.runs))
        bare_many = statistics.median(timed(names, BARE) for _ in range(args.runs))
    finally:
        if not args.keep:
            for h in light:
                lab.remove(h)
    print(f"\nfleet scale, pyinfra --dry of the vLLM deploy, median of {args.runs} runs "
          f"({os.cpu_count()} cores on the controller):")
    print(f"  1 host:            {one:6.2f} s")
    print(f"  {len(names)} hosts:          {many:6.2f} s")
    print(f"  {len(names)} hosts / 1 host: {many / one:6.2f} x   (target <= 1.5)")
    print(f"  a bare one-fact deploy, same hosts: {bare_one:.2f} s and {bare_many:.2f} s: "
          f"{bare_many / bare_one:.2f} x (pyinfra's own floor on this controller)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
