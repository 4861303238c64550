"""Installing PyPI's CUDA 13.0 vLLM 0.33.0 on a Debian 13 lab host, from the controller's store and from
the lab's PyPI mirror, cold and warm, with the bytes the controller sends the host in each mode.

  python bench/cuda_install.py

Boots lab5 (store mode) and then lab6 (registry mode): Debian 13 hosts whose nvidia-smi replays a real H100
capture (fleetlab/gpusim.py; no GPU exists here), staged with `vllm-fleet stage` from
tests/hosts/inventory_stage.py. Each host is staged twice:
- cold: a fresh host (empty wheel store and uv cache);
- warm: the release directory removed, so the build runs again with the host's store and uv cache full.
The controller's lock and store are warm (the first `make test` or run of this script fills them).

Bytes: tc (htb) class counters on the controller's side of the host's veth, split by port: SSH (dport 22,
what the controller's pyinfra sends) and the mirror (sport 18091, what proxpi serves the host). The stage
times include the validation (vLLM imported by the new release). Each host is removed at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fleetlab as lab  # noqa: E402
from fleetlab import gpusim, pypimirror  # noqa: E402

INVENTORY = str(ROOT / "tests/hosts/inventory_stage.py")
CLI = str(Path(sys.executable).parent / "vllm-fleet")
RELEASE = "/opt/vllm/releases/0.33.0-cu130"


def counters_on(dev: str) -> None:
    """htb classes used as counters only (rates far above the veth's): 1:1 SSH to the host, 1:2 the
    mirror's answers, 1:30 the rest. (This machine's kernel has htb and u32, not prio or tc actions.)"""
    subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)
    cmds = [f"qdisc add dev {dev} root handle 1: htb default 30 r2q 100000"]
    cmds += [f"class add dev {dev} parent 1: classid 1:{c} htb rate 40gbit" for c in (1, 2, 30)]
    cmds += [f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dport 22 0xffff flowid 1:1",
             f"filter add dev {dev} parent 1: protocol ip prio 2 u32 match ip sport {pypimirror.PORT} "
             "0xffff flowid 1:2"]
    for cmd in cmds:
        subprocess.run(["tc", *cmd.split()], check=True, capture_output=True)


def counters(dev: str) -> dict[str, int]:
    out = subprocess.run(["tc", "-s", "class", "show", "dev", dev], capture_output=True, text=True).stdout
    got = {m[0]: int(m[1]) for m in re.findall(r"class htb 1:(\d+) .*?\n\s*Sent (\d+) bytes", out, re.S)}
    return {"ssh": got.get("1", 0), "mirror": got.get("2", 0)}


def stage(host: lab.LabHost) -> tuple[float, dict[str, int], str]:
    dev = f"ve-{host.name}"
    before = counters(dev)
    t0 = time.monotonic()
    proc = subprocess.run([CLI, "stage", INVENTORY, "--limit", host.name], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(proc.stdout[-4000:] + proc.stderr[-2000:])
    after = counters(dev)
    return took, {k: after[k] - before[k] for k in after}, proc.stdout + proc.stderr


def install_seconds(out: str, host: str) -> str:
    ticks = re.findall(rf"\[{host}\] install 0\.33\.0-cu130: .*?, (\d+) s", out)
    return f"{ticks[-1]}+ s" if ticks else "<3 s"


def main() -> int:
    pypimirror.start()
    rows = []
    for index, mode in ((5, "store"), (6, "mirror")):
        host = next(h for h in lab.up_stage([index]) if h.index == index)
        try:
            gpusim.replay(host)
            counters_on(f"ve-{host.name}")
            cold = stage(host)
            lab.ssh(host, f"rm -rf {RELEASE} /var/lib/vllm-fleet/staged/*.validated", timeout=300)
            warm = stage(host)
        finally:
            lab.remove(host)
        for kind, (took, sent, out) in (("cold", cold), ("warm", warm)):
            rows.append((mode, kind, took, install_seconds(out, host.name), sent["ssh"], sent["mirror"]))
    print("\n" + f"{'source':<8}{'host':<6}{'stage (s)':>10}{'install':>10}"
          f"{'ssh to host':>14}{'mirror to host':>16}")
    for mode, kind, took, inst, ssh, mirror in rows:
        print(f"{mode:<8}{kind:<6}{took:>10.1f}{inst:>10}{ssh / 2**20:>11.1f} MiB{mirror / 2**20:>13.1f} MiB")
    by = {(m, k): t for m, k, t, *_ in rows}
    print(f"\ncold store / cold mirror: {by['store', 'cold'] / by['mirror', 'cold']:.2f}x; "
          f"warm store / warm mirror: {by['store', 'warm'] / by['mirror', 'warm']:.2f}x (stage wall time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
