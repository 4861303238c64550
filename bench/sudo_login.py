"""A `deploy` login with sudo against a root login, side by side in one run (ratios, not absolute times).

  python bench/sudo_login.py [--runs 5] [--first 1]

Needs a deployed lab (`make demo`): lab1 logs in as `deploy` with sudo, lab2 as root. Prints:
- the no-op rerun of each (one host per run, the two alternating), medians and the pairwise ratio, and
  the remote commands each runs (pyinfra -vvv);
- a first deploy (full install, start, smoke test) onto a fresh lab3 with each login, one after the
  other (`--first 0` skips it: each costs a fresh host, ~0.6 GiB of wheels sent and a vLLM start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
LAB = str(ROOT / "fleetlab" / "inventories" / "lab.py")
# lab3 with either login, for the first deploys
FRESH = """
import os
import fleetlab as lab
from fleetlab.inventory import connection, lab_vllm
data = connection(lab.LabHost(3))
if os.environ["BENCH_LOGIN"] == "root":
    data = {**{k: v for k, v in data.items() if k != "_sudo"}, "ssh_user": "root"}
fresh = [("lab3", {**data, "vllm": lab_vllm(3)})]
"""


def timed(inventory: str, limit: str | None, extra: tuple[str, ...] = (), env: dict | None = None
          ) -> tuple[float, str]:
    cmd = [PYINFRA, "-y", *extra, inventory, "deploys/vllm.py"]
    if limit:
        cmd[2:2] = ["--limit", limit]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    took = time.monotonic() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return took, out.stdout + out.stderr


def commands(host: str) -> list[str]:
    _, verbose = timed(LAB, host, ("-vvv",))
    return [line.split(" >>> ", 1)[1] for line in verbose.splitlines() if line.startswith(f"[{host}] >>> ")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--first", type=int, default=1, help="first deploys per login onto a fresh lab3")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab
    from fleetlab.inventory import connection

    logins = {name: connection(lab.LabHost(int(name[3:]))) for name in ("lab1", "lab2")}
    if logins["lab1"].get("_sudo") is not True or logins["lab2"]["ssh_user"] != "root":
        sys.exit("expected lab1 to log in as deploy with sudo and lab2 as root")
    if not {"lab1", "lab2"} <= {h.name for h in lab.read_state()}:
        sys.exit("lab1 and lab2 must be up and deployed: run `make demo` first")
    timed(LAB, None)  # both converged before measuring
    sudo, root, ratios = [], [], []
    for _ in range(args.runs):
        a, b = timed(LAB, "lab1")[0], timed(LAB, "lab2")[0]
        sudo.append(a)
        root.append(b)
        ratios.append(a / b)
    cmds = {h: commands(h) for h in ("lab1", "lab2")}

    first: dict[str, list[float]] = {"deploy+sudo": [], "root": []}
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "fresh.py"
        inv.write_text(FRESH)
        for _ in range(args.first):
            for label, login in (("deploy+sudo", "sudo"), ("root", "root")):
                lab.remove(lab.LabHost(3))
                lab.up(3, log=lambda _: None)
                first[label].append(timed(str(inv), None, env={"BENCH_LOGIN": login})[0])
        if args.first:
            lab.remove(lab.LabHost(3))

    med = statistics.median
    print(f"\nno-op rerun, one host per run, alternating, median of {args.runs}:")
    print(f"  lab1, deploy + sudo   {med(sudo):6.2f} s  (min {min(sudo):.2f}, max {max(sudo):.2f})")
    print(f"  lab2, root login      {med(root):6.2f} s  (min {min(root):.2f}, max {max(root):.2f})")
    print(f"  sudo / root, pairwise {med(ratios):6.2f} x  (min {min(ratios):.2f}, max {max(ratios):.2f})")
    for h, label in (("lab1", "deploy + sudo"), ("lab2", "root")):
        print(f"  remote commands, {label}: {len(cmds[h])}")
        for c in cmds[h]:
            c = c.replace("'\"'\"'", "'")
            print(f"    {c[:104]}{' ...' if len(c) > 104 else ''}")
    if args.first:
        print(f"\nfirst deploy onto a fresh lab3 (install, validate, start, smoke), {args.first} each:")
        for label, secs in first.items():
            print(f"  {label:<12} {med(secs):6.1f} s  ({', '.join(f'{s:.1f}' for s in secs)})")
        print(f"  sudo / root  {med(first['deploy+sudo']) / med(first['root']):6.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
