"""No-op converge figures, measured side by side in one run (ratios, not absolute times).

  python bench/noop_converge.py [--runs 3]

Needs a deployed lab (`make demo`). Prints: median wall time of a no-change deploy against 1 host and
against every lab host, the same for a bare one-fact pyinfra deploy, their ratios against the targets,
and the remote commands one host runs on a no-change deploy (counted from pyinfra -vvv).
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


def timed(deploy: str, limit: str | None, extra: tuple[str, ...] = ()) -> tuple[float, str]:
    cmd = [PYINFRA, "-y", *extra, INVENTORY, deploy]
    if limit:
        cmd[2:2] = ["--limit", limit]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ)
    took = time.monotonic() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return took, out.stdout + out.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab

    hosts = [h.name for h in lab.read_state()]
    if not hosts:
        sys.exit("no lab hosts: run `make demo` first")
    full, bare = "deploys/vllm.py", "bench/bare_fact.py"
    timed(full, None)  # warm: every host converged before measuring
    rows = {}
    cases = (("deploy, 1 host", full, hosts[0]), (f"deploy, {len(hosts)} hosts", full, None),
             ("bare fact, 1 host", bare, hosts[0]), (f"bare fact, {len(hosts)} hosts", bare, None))
    for label, deploy, limit in cases:
        rows[label] = statistics.median(timed(deploy, limit)[0] for _ in range(args.runs))
    _, verbose = timed(full, hosts[0], ("-vvv",))
    commands = [line for line in verbose.splitlines() if line.startswith(f"[{hosts[0]}] >>> ")]

    print(f"\nno-op converge, median of {args.runs} runs each (lab, {len(hosts)} hosts, 2 cores):")
    for label, secs in rows.items():
        print(f"  {label:<22} {secs:6.2f} s")
    n = len(hosts)
    scale = rows[f"deploy, {n} hosts"] / rows["deploy, 1 host"]
    floor = rows[f"deploy, {n} hosts"] / rows[f"bare fact, {n} hosts"]
    print(f"\n  {n} hosts / 1 host:            {scale:5.2f} x   (target <= 1.2)")
    print(f"  deploy / bare one-fact deploy: {floor:5.2f} x   (target <= 2.0)")
    print(f"  remote commands per host:      {len(commands):5d}     (target <= 15):")
    for line in commands:
        cmd = line.split(" >>> ", 1)[1].replace("'\"'\"'", "'")
        print(f"    {cmd[:110]}{' ...' if len(cmd) > 110 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
