"""A release installed from the controller's warm wheel cache against a first install with an empty
cache, measured side by side in one run on one lab host (ratios, not absolute times).

  python bench/install_reuse.py [--host lab3] [--runs 1] [--second 0.31.0]

Each measurement starts the host from nothing for this release: the service stopped, the release
directory, any half-built one, the host's uv cache and its wheel store removed. Then
bench/install_release.py (the install part of deploys/vllm.py) runs with either an empty
VLLM_FLEET_CACHE (pip downloads every wheel, then tars them for the host) or the lab's warm one.
Runs alternate cold / warm. Then a second release (--second) is installed beside the running one, from
a controller cache filled beforehand, with the host's wheel store and uv cache as the first install
left them: a release upgrade, which sends only the wheels the host lacks and links the unchanged
packages.
At the end the ordinary deploy puts the host back: its normal release, serving, smoke-tested.

Downloads are counted from the controller's own log line ("store: downloading ..."), printed once per
release and target whatever the host count (vllm_fleet/controller/locks.py), and their bytes from the
store they filled; what each host receives is one tar of the wheels its store lacks
(the deploy logs "wheels for R: sent N of M (K MiB)").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
INVENTORY = str(ROOT / "fleetlab" / "inventories" / "lab.py")
TARGET = 5.0


def pyinfra(deploy: str, host: str, env: dict[str, str], inventory: str = INVENTORY) -> tuple[float, str]:
    cmd = [PYINFRA, "-y", "--limit", host, inventory, deploy]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    took = time.monotonic() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
    return took, out.stdout + out.stderr


def ssh(address: str, key: Path, command: str) -> str:
    from fleetlab import SSH_OPTS

    out = subprocess.run(["ssh", *SSH_OPTS, "-i", str(key), f"root@{address}", command],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"on the host: {command}\n{out.stderr[-2000:]}")
    return out.stdout


def first_import(address: str, key: Path, release: str) -> float:
    """The release's first `import vllm` (bytecode compiled and written, as root): the deploy's validate
    step pays it right after the install, so it is reported beside the install, not hidden in it."""
    py = f"/opt/vllm/releases/{release}/bin/python"
    out = ssh(address, key,
              f"s=$(date +%s%N); {py} -c 'import vllm.version' && echo $(( $(date +%s%N) - s ))")
    return int(out.split()[-1]) / 1e9


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="lab3")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--second", default="0.31.0",
                    help="a second release to install next to the running one ('' to skip)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab
    from fleetlab.inventory import TINY_MODEL
    from vllm_fleet.controller import locks

    hosts = {h.name: h for h in lab.read_state()}
    if args.host not in hosts:
        sys.exit(f"{args.host} is not up (lab hosts: {', '.join(hosts) or 'none'})")
    address, key = hosts[args.host].address, lab.ssh_key()
    base_env = {**os.environ, "VLLM_FLEET_TINY_MODEL": str(TINY_MODEL)}
    release = ssh(address, key, "readlink /opt/vllm/current").strip().rsplit("/", 1)[-1]
    if not release:
        sys.exit(f"{args.host} has no current release: deploy it first")
    if not any(locks.STORE.glob("*.whl")):
        sys.exit(f"no warm store at {locks.STORE}: run `make demo` first")
    unit = "vllm-default.service"
    fresh = (f"systemctl stop {unit}; rm -rf /opt/vllm/releases/{release} /opt/vllm/releases/.tmp-{release} "
             "/opt/vllm/releases/.uv-cache /root/.cache/uv /var/cache/vllm-fleet/wheels")

    times: dict[str, list[float]] = {"cold": [], "warm": []}
    imports: dict[str, list[float]] = {"cold": [], "warm": [], "second": []}
    downloads = {"cold": 0, "warm": 0}
    cold_bytes = cold_wheels = 0
    fetch_s: list[float] = []
    bundle_bytes = 0
    for _ in range(args.runs):
        for kind in ("cold", "warm"):
            ssh(address, key, fresh)
            env = dict(base_env)
            tmp = None
            if kind == "cold":
                tmp = tempfile.mkdtemp(prefix="vllm-fleet-cold-cache-", dir="/var/tmp")
                env["VLLM_FLEET_CACHE"] = tmp
            try:
                took, out = pyinfra("bench/install_release.py", args.host, env)
                if f"build release {release}" not in out:
                    sys.exit(f"the {kind} run did not build {release}:\n{out[-2000:]}")
                downloads[kind] += sum(1 for line in out.splitlines() if "store: downloading" in line)
                fetch_s += [float(m) for m in re.findall(r"store: \d+ wheels, [\d.]+ GiB in (\d+) s", out)]
                if tmp:
                    cache = Path(tmp) / "wheels" / "files"
                    cold_bytes, cold_wheels = dir_bytes(cache), sum(1 for _ in cache.glob("*.whl"))
                    bundle_bytes = dir_bytes(Path(tmp) / "bundles")
            finally:
                if tmp:
                    shutil.rmtree(tmp, ignore_errors=True)
            times[kind].append(took)
            imports[kind].append(first_import(address, key, release))
            print(f"{kind} install of {release} on {args.host}: {took:.1f} s, then its first import "
                  f"{imports[kind][-1]:.1f} s", flush=True)

    # The case the cache is for: a second release on a host that runs one. The controller downloads the
    # second release once (not timed: once per fleet), the host keeps the uv cache its first install left.
    second_took, second_sent = None, ""
    if args.second:
        inv = ROOT / ".cache" / "bench-second-release.py"
        inv.parent.mkdir(exist_ok=True)
        inv.write_text("from fleetlab.inventory import lab_hosts\n"
                       f"lab = [(n, {{**d, 'vllm': {{**d['vllm'], 'version': {args.second!r}}}}}) "
                       "for n, d in lab_hosts()]\n")
        second = f"{args.second}-cpu"
        ssh(address, key, f"rm -rf /opt/vllm/releases/{second} /opt/vllm/releases/.tmp-{second}")
        pyinfra("bench/fill_wheel_cache.py", args.host, base_env, inventory=str(inv))
        second_took, out = pyinfra("bench/install_release.py", args.host, base_env, inventory=str(inv))
        if f"build release {second}" not in out:
            sys.exit(f"the second-release run did not build {second}:\n{out[-2000:]}")
        imports["second"].append(first_import(address, key, second))
        ssh(address, key, f"rm -rf /opt/vllm/releases/{second}")
        m = re.search(r"wheels for \S+: (sent \d+ of \d+ \(\d+ MiB\))", out)
        second_sent = m.group(1) if m else "(no 'wheels for' line)"
        print(f"second release {second} on {args.host} (host uv cache kept): {second_took:.1f} s", flush=True)

    # back to normal: the ordinary deploy finds its release present and restarts the stopped service
    _, out = pyinfra("deploys/vllm.py", args.host, base_env)
    smoke = [line for line in out.splitlines() if line.startswith(args.host)]
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["cold"] / med["warm"]
    gib = 1024 ** 3
    print(f"\n{args.host} restored by deploys/vllm.py: " + (smoke[-1] if smoke else "(no smoke line)"))
    print(f"\ninstall of release {release} on {args.host} (fresh host each time), median of {args.runs}:")
    print(f"  first install, empty controller cache:  {med['cold']:7.1f} s   runs: "
          + ", ".join(f"{t:.1f}" for t in times["cold"]))
    print(f"  install from the warm wheel cache:      {med['warm']:7.1f} s   runs: "
          + ", ".join(f"{t:.1f}" for t in times["warm"]))
    if fetch_s:
        secs = statistics.median(fetch_s)
        print(f"  of the first install, pip download into the empty cache: {secs:.0f} s "
              "(torch from the local folder pip is configured with, the rest from PyPI)")
    print(f"  wheel downloads: {downloads['cold']} in {args.runs} cold run(s) ({cold_wheels} wheels, "
          f"{cold_bytes / gib:.2f} GiB), {downloads['warm']} in {args.runs} warm run(s); per host over the "
          f"LAN to a host with an empty store: {bundle_bytes / gib:.2f} GiB")
    print("  for N hosts: 1 download per release and target (vllm_fleet/controller/locks.py), "
          "each host sent what its store lacks")
    # no target: a host with nothing on it builds the whole venv either way; the target is the next one
    print(f"  cold / warm (same release, host from nothing):  {ratio:5.2f} x   "
          "(the host's whole build in both: no target)")
    if second_took is not None:
        r2 = med["cold"] / second_took
        verdict = "met" if r2 >= TARGET else "NOT met"
        print(f"  second release {args.second} from the warm cache on a host that runs {release}: "
              f"{second_took:.1f} s; {second_sent}")
        print(f"  cold / second release:  {r2:5.2f} x   (target >= {TARGET:g}: {verdict})")
        imp = {k: statistics.median(v) for k, v in imports.items()}
        print(f"  each release's first import of vllm (the deploy's validate step, right after): cold "
              f"{imp['cold']:.1f} s, warm {imp['warm']:.1f} s, second {imp['second']:.1f} s")
        r3 = (med["cold"] + imp["cold"]) / (second_took + imp["second"])
        print(f"  cold / second release, each with its first import:  {r3:5.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
