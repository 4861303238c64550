"""What clients see during a 3-host rollout through haproxy: draining on against off, in one run.

  python bench/rollout_under_load.py [--rate 4]

Boots what is missing (lab1-3 serving on the lab network, lab7 running the distribution's haproxy in
front of them), then runs two rollouts of a flag change, each under a fixed rate of small completions
sent through haproxy (counted, timed, never retried, stopping by itself):
- draining on: each host is drained in haproxy before its restart and made ready after its smoke test,
  and vLLM finishes in-flight requests on SIGTERM (--shutdown-timeout 30);
- draining off: what a rollout did before (no drain; vLLM's own shutdown-timeout 0 aborts in-flight
  requests); haproxy still retries connections refused before the request reached vLLM.
Prints requests sent, failed, p50/p99 latency before and during each rollout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
INVENTORY = """
import fleetlab as lab
from fleetlab.inventory import connection, lab_vllm
from vllm_fleet.core.spec import deep_merge
over = {over!r}
vllm = [(h.name, {{**connection(h), "vllm": deep_merge(lab_vllm(h.index), over)}})
        for h in lab.read_state() if h.role == "vllm"]
lb = [("lab7", {{**connection(lab.LabHost(7, "plain")), "vllm_lb": {lb!r}}})]
"""


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
    return out


def one(inv: Path, drain: bool, seqs: int, rate: float, tokens: int) -> tuple[dict, dict, float]:
    from vllm_fleet.controller.load import Load, summary

    over = {"flags": {"host": "0.0.0.0", "shutdown_timeout": 30 if drain else 0}}
    # haproxy alone, no router: what is measured is the drain
    lb = {"port": 8080, "check_interval_s": 1, "drain": drain, "router": None}
    inv.write_text(INVENTORY.format(over=over, lb=lb))
    run([str(BIN / "pyinfra"), "-y", str(inv), "deploys/vllm.py", "deploys/lb.py"])  # settle first
    time.sleep(5)  # haproxy's checks see every server up
    inv.write_text(INVENTORY.format(over={"flags": {**over["flags"], "max_num_seqs": seqs}}, lb=lb))
    load = Load("http://10.77.7.2:8080", "tiny-llama", os.environ["VLLM_API_KEY"], rate_per_s=rate,
                max_s=900, max_tokens=tokens).start()
    time.sleep(15)
    began = load.mark()
    t0 = time.monotonic()
    run([str(BIN / "vllm-fleet"), "rollout", str(inv), "--canary", "1", "--wave", "1"])
    took = time.monotonic() - t0
    ended = load.mark()
    time.sleep(3)
    load.stop()
    before = summary([s for s in load.samples if s.t < began])
    during = summary([s for s in load.samples if began <= s.t <= ended])
    during["errors"] = sorted({s.detail.split(":")[0] for s in load.samples if not s.ok and began <= s.t})
    return before, during, took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second through haproxy")
    ap.add_argument("--tokens", type=int, default=8, help="tokens per completion (longer: more in flight)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab

    lab.up(3, plain=2, log=lambda _: None)
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "lab_lb.py"
        results = {"draining on": one(inv, True, 6, args.rate, args.tokens),
                   "draining off": one(inv, False, 7, args.rate, args.tokens)}
        inv.write_text(INVENTORY.format(over={}, lb={"port": 8080}))
    print(f"\nrollout of 3 hosts (canary 1, waves of 1) under {args.rate:g} completions/s of {args.tokens} "
          "tokens through haproxy:")
    print(f"  {'':<14} {'when':<22} {'sent':>6} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for label, (before, during, took) in results.items():
        for when, s in (("before", before), (f"during ({took:.0f} s)", during)):
            print(f"  {label:<14} {when:<22} {s['sent']:>6} {s['failed']:>7} {s['p50_ms']:>8.0f} "
                  f"{s['p99_ms']:>8.0f}")
        if during.get("errors"):
            print(f"  {'':<13} failures: {', '.join(during['errors'])}")
    print(json.dumps({k: {"before": v[0], "during": v[1]} for k, v in results.items()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
