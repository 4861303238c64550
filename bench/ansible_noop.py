"""No-change converge against Ansible, measured side by side in one run (ratios, not absolute times).

  python bench/ansible_noop.py [--host lab3] [--runs 3]

Needs a deployed lab host; ansible-core comes from the `bench` extra or is installed into .cache/ansible-venv.
The Ansible play (bench/ansible/vllm.yml) asserts the same host configuration deploys/vllm.py makes, with
every file's content rendered by our own code (bench/ansible/render_desired.py), and the same smoke
checks; a run counts only when it changed nothing. Runs alternate Ansible / our deploy / a bare
12-step pyinfra deploy so the machine's noise hits all three alike; the medians and the ratio against
the target are the last lines.
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
BIN = Path(sys.executable).parent
PYINFRA = str(BIN / "pyinfra")
INVENTORY = str(ROOT / "fleetlab" / "inventories" / "lab.py")
PLAY = ROOT / "bench" / "ansible" / "vllm.yml"
TARGET = 0.25


def ansible_playbook() -> str:
    for cand in (BIN / "ansible-playbook", ROOT / ".cache" / "ansible-venv" / "bin" / "ansible-playbook"):
        if cand.exists():
            return str(cand)
    found = shutil.which("ansible-playbook")
    if found:
        return found
    # a bench-only dependency: its own venv, so the project's never carries it
    venv = ROOT / ".cache" / "ansible-venv"
    print(f"installing ansible-core into {venv} (bench only, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "ansible-core"], check=True)
    return str(venv / "bin" / "ansible-playbook")


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{text[-3000:]}")
    return took, text


def check_no_change(kind: str, text: str) -> None:
    """A timing only counts if nothing changed: a restart or upload would measure something else."""
    if kind == "ansible":
        recap = re.search(r"changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", text)
        if not recap or recap.groups() != ("0", "0", "0"):
            sys.exit(f"Ansible changed the host or failed:\n{text[-3000:]}")
    elif kind == "ours":
        changes = r"Starting operation: (?:[^|]+\| )?(restart|build release|serve config|env file|unit )"
        changing = [line for line in text.splitlines() if re.search(changes, line)]
        if changing:
            sys.exit("our deploy was not a no-change run:\n" + "\n".join(changing))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="lab3")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab

    hosts = {h.name: h for h in lab.read_state()}
    if args.host not in hosts:
        sys.exit(f"{args.host} is not up (lab hosts: {', '.join(hosts) or 'none'})")
    key = os.environ.get("VLLM_API_KEY")
    if not key:
        sys.exit("VLLM_API_KEY is not set: source scripts/lab-env.sh")
    playbook = ansible_playbook()
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAY.parent / "ansible.cfg")}

    with tempfile.TemporaryDirectory(prefix="vllm-fleet-ansible-") as tmp:
        run([PYINFRA, "-y", "--limit", args.host, INVENTORY, "bench/ansible/render_desired.py"],
            {**env, "VLLM_FLEET_RENDER_DIR": tmp})
        rendered = Path(tmp) / args.host
        inv = Path(tmp) / "hosts.yml"
        inv.write_text(f"vllm:\n  hosts:\n    {args.host}:\n      ansible_host: {hosts[args.host].address}\n"
                       f"      ansible_user: root\n      ansible_ssh_private_key_file: {lab.ssh_key()}\n")
        commands = {
            "ansible": [playbook, "-i", str(inv), "-e", f"rendered={rendered}", str(PLAY)],
            "ours": [PYINFRA, "-y", "--limit", args.host, INVENTORY, "deploys/vllm.py"],
            "bare": [PYINFRA, "-y", "--limit", args.host, INVENTORY, "bench/ansible/bare12.py"],
        }
        for kind, cmd in commands.items():  # warm-up: each converged once, and checked unchanged
            check_no_change(kind, run(cmd, env)[1])
        times: dict[str, list[float]] = {k: [] for k in commands}
        leaked = 0
        for _ in range(args.runs):
            for kind, cmd in commands.items():
                took, text = run(cmd, env)
                check_no_change(kind, text)
                leaked += text.count(key)
                times[kind].append(took)
        # the same play at Ansible's highest verbosity, not timed: no_log must hold there too
        _, verbose = run([*commands["ansible"], "-vvv"], env)
        leaked += verbose.count(key)
        tasks = len(re.findall(r"^TASK \[", verbose, flags=re.M))

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nno-change converge of {args.host}, median of {args.runs} alternating runs (2 cores, noisy):")
    labels = {"ansible": f"Ansible playbook ({tasks} tasks)", "ours": "our deploy (deploys/vllm.py)",
              "bare": "bare 12-step pyinfra deploy"}
    for kind, label in labels.items():
        print(f"  {label:<34} {med[kind]:6.2f} s   runs: {', '.join(f'{t:.2f}' for t in times[kind])}")
    print(f"  API key occurrences in all output (incl. ansible -vvv): {leaked}   (target 0)")
    print(f"  ours / bare 12-step pyinfra:  {med['ours'] / med['bare']:5.2f} x")
    ratio = med["ours"] / med["ansible"]
    print(f"  ours / Ansible:               {ratio:5.2f} x   (target <= {TARGET}: "
          f"{'met' if ratio <= TARGET else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
