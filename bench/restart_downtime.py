"""Seconds a lab host is out of service for a config change, and where the time goes.

  python bench/restart_downtime.py [--host lab1]

Needs a deployed lab (`make demo`). Polls /health every 0.2 s on the host itself while a deploy
changes one flag (max_num_seqs) and then changes it back; prints, per restart, the seconds of non-200
/health, and the ready time split into process start (unit start -> vLLM's first log line), model
load and engine init (from vLLM's log), and the smoke test's first completion.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fleetlab as lab  # noqa: E402
from fleetlab.probe import HealthPoll  # noqa: E402


def on(host: lab.LabHost, cmd: str) -> str:
    return lab.ssh(host, cmd, timeout=120).stdout


def deploy(name: str, seqs: int | None) -> tuple[float, dict]:
    over = {name: {"flags": {"max_num_seqs": seqs}}} if seqs else {}
    out_json = f"/tmp/bench-smoke-{os.getpid()}.json"
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(over), "VLLM_FLEET_SMOKE_JSON": out_json}
    t0 = time.time()
    proc = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "--limit", name,
                           str(ROOT / "tests/hosts/inventory.py"), "deploys/vllm.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-2000:])
    smoke = json.loads(Path(out_json).read_text())[0]
    Path(out_json).unlink()
    return t0, smoke


def phases(host: lab.LabHost, since: float) -> dict[str, float]:
    text = on(host, f"journalctl -u vllm-default -o short-unix --no-pager --since @{int(since)}")
    marks: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(\d+\.\d+) \S+ (.*)$", line)
        if not m:
            continue
        t, msg = float(m.group(1)), m.group(2)
        for key, pat in (("unit start", r"Started vllm-default"), ("first log", r"version 0\.\d+"),
                         ("weights loaded", r"Loading weights took"), ("engine ready", r"init engine"),
                         ("serving", r"Application startup complete")):
            if re.search(pat, msg) and key not in marks:
                marks[key] = t
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="lab1")
    args = ap.parse_args()
    host = lab.LabHost(int(args.host.removeprefix("lab")))
    print(f"restart downtime on {args.host} (vLLM CPU build, tiny model, 2 cores):")
    for label, seqs in (("config change", 6), ("change back", None)):
        poll = HealthPoll(host)
        poll.start()
        t0, smoke = deploy(args.host, seqs)
        time.sleep(1)
        rows = poll.stop()
        down = [t for t, code in rows if code != "200"]
        outage = (max(down) - min(down) + 0.2) if down else 0.0
        m = phases(host, t0 - 1)
        first_token = next(c["ms"] for c in smoke["checks"] if c["name"] == "completion")
        print(f"  {label}: non-200 /health for {outage:.1f} s ({len(down)} of {len(rows)} samples)")
        if {"unit start", "first log", "weights loaded", "engine ready", "serving"} <= m.keys():
            print(f"    process start {m['first log'] - m['unit start']:.1f} s, to weights loaded "
                  f"{m['weights loaded'] - m['first log']:.1f} s, engine init "
                  f"{m['engine ready'] - m['weights loaded']:.1f} s, to serving "
                  f"{m['serving'] - m['engine ready']:.1f} s; first completion {first_token:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
