"""The front door's router against round-robin, and what the door adds to a request, in one run.

  python bench/routing.py [--conversations 16] [--turns 4] [--direct 100]

Boots what is missing (lab1 and lab2 serving the tiny model on the lab network, lab7 as the door with
one tenant; vllm-router comes from PyPI through the lab's mirror), then:

1. a multi-turn workload through the door, once per router policy (cache_aware, then round_robin):
   conversations in groups sharing a long system prompt, each turn sending the conversation so far
   plus a new question (streamed, so the time to the first token is measured). Each policy's run has
   its own random system prompts, so nothing it finds cached is the other run's. Prefix-cache hit
   rate from vLLM's own counters on both instances (hits / queried tokens over the run).
2. the door's added latency: one-token completions sent alternately straight to an instance and
   through the door (tenant key check, model routing, router, listener), p50 and p99 of each.

Prints a table and one JSON line. CPU figures from the lab: the router's decisions are what is
compared, not the hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOOR = "http://10.77.7.2:8080"
HOSTS = {"lab1": "10.77.1.2", "lab2": "10.77.2.2"}
INVENTORY = """
import fleetlab as lab
from fleetlab.inventory import connection, lab_vllm
from vllm_fleet.core.spec import deep_merge
net = {over!r}
vllm = [(h.name, {{**connection(h), "vllm": deep_merge(lab_vllm(h.index), net)}})
        for h in lab.read_state() if h.role == "vllm" and h.name in {hosts!r}]
lb = [("lab7", {{**connection(lab.LabHost(7, "plain")), "vllm_lb": {lb!r}}})]
"""
WORDS = [
    "fleet",
    "model",
    "cache",
    "token",
    "prefix",
    "router",
    "engine",
    "batch",
    "queue",
    "latency",
    "shard",
    "tensor",
    "replica",
    "driver",
    "kernel",
    "memory",
    "rollout",
    "canary",
    "wave",
    "drain",
    "health",
    "metric",
    "tenant",
]


def run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")


def prefix_counters() -> tuple[float, float]:
    """(hit tokens, queried tokens) summed over both instances, from vLLM's /metrics."""
    hits = queries = 0.0
    for address in HOSTS.values():
        text = httpx.get(
            f"http://{address}:8000/metrics",
            timeout=30,
            headers={"Authorization": f"Bearer {os.environ['VLLM_API_KEY']}"},
        ).text
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total{"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total{"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def ttft(client: httpx.Client, prompt: str) -> tuple[float, str]:
    """Seconds to the first streamed token, and the whole answer."""
    t0 = time.monotonic()
    first, text = None, []
    with client.stream(
        "POST",
        "/v1/completions",
        json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 8, "stream": True, "ignore_eos": True},
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                first = first or time.monotonic() - t0
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return first or float("nan"), "".join(text)


def workload(key: str, conversations: int, turns: int, groups: int, concurrency: int) -> list[float]:
    """Turn by turn across every conversation (each turn of all of them, `concurrency` at a time, then
    the next turn), as chat users interleave: between two turns of one conversation every other one
    has grown, so an instance that is sent everything must hold everything. Each conversation is a
    system prompt shared by its group plus a document of its own. Returns TTFTs."""
    rng = random.Random(secrets.randbits(32))
    systems = [f"[{secrets.token_hex(4)}] You are assistant {g}. " + " ".join(rng.choices(WORDS, k=20))
               for g in range(groups)]
    docs = [f"\nDocument {secrets.token_hex(4)}: " + " ".join(rng.choices(WORDS, k=40))
            for _ in range(conversations)]
    history = [systems[n % groups] + docs[n] for n in range(conversations)]
    out: list[float] = []
    lock = threading.Lock()
    for t in range(turns):
        todo = list(range(conversations))
        rng.shuffle(todo)

        def worker(t: int = t, todo: list[int] = todo) -> None:
            with httpx.Client(base_url=DOOR, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
                while True:
                    with lock:
                        if not todo:
                            return
                        n = todo.pop()
                    prompt = history[n] + f"\nUser {n}: question {t} about {rng.choice(WORDS)}?\nAssistant:"
                    took, answer = ttft(c, prompt)
                    with lock:
                        history[n] = prompt + answer
                        out.append(took)

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def door_latency(key: str, n: int) -> dict[str, list[float]]:
    body = {"model": "tiny-llama", "prompt": "ping", "max_tokens": 1}
    times: dict[str, list[float]] = {"direct": [], "door": []}
    with httpx.Client(timeout=60) as c:
        for i in range(2 * n):
            which = ("direct", "door")[i % 2]
            url = f"http://{HOSTS['lab1']}:8000" if which == "direct" else DOOR
            auth = os.environ["VLLM_API_KEY"] if which == "direct" else key
            t0 = time.monotonic()
            r = c.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {auth}"})
            r.raise_for_status()
            times[which].append((time.monotonic() - t0) * 1000)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--groups", type=int, default=4, help="system prompts shared by the conversations")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--direct", type=int, default=100, help="requests each way for the door's latency")
    ap.add_argument("--block-size", type=int, default=32, help="KV block: a turn's new tokens fill blocks")
    ap.add_argument("--kv-blocks", type=int, default=112,
                    help="KV blocks per instance: half the conversations fit, not all of them")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import fleetlab as lab
    from fleetlab import pypimirror

    lab.up(2, plain=2, log=lambda _: None)
    pypimirror.start()
    key = os.environ.setdefault("BENCH_TENANT_KEY", "bench-" + secrets.token_hex(16))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "lab_door.py"
        for policy in ("cache_aware", "round_robin"):
            door = {
                "port": 8080,
                "check_interval_s": 2,
                "router": {"policy": policy, "index_url": pypimirror.index_url()},
                "tenants": [{"name": "bench", "key_envs": ["BENCH_TENANT_KEY"]}],
            }
            over = {"flags": {"host": "0.0.0.0", "block_size": args.block_size,
                              "extra_args": {"num-gpu-blocks-override": args.kv_blocks}}}
            inv.write_text(INVENTORY.format(hosts=list(HOSTS), lb=door, over=over))
            run([str(BIN / "pyinfra"), "-y", str(inv), "deploys/vllm.py", "deploys/lb.py"])
            time.sleep(5)  # the router's and the listeners' checks see both instances up
            h0, q0 = prefix_counters()
            t0 = time.monotonic()
            ttfts = workload(key, args.conversations, args.turns, args.groups, args.concurrency)
            took = time.monotonic() - t0
            h1, q1 = prefix_counters()
            results[policy] = {
                "requests": len(ttfts),
                "hit_rate": (h1 - h0) / max(q1 - q0, 1),
                "ttft_p50_ms": 1000 * statistics.median(ttfts),
                "ttft_p99_ms": 1000 * pct(ttfts, 0.99),
                "wall_s": took,
            }
        lat = door_latency(key, args.direct)
    pypimirror.stop()
    ca, rr = results["cache_aware"], results["round_robin"]
    print(
        f"\n{args.conversations} conversations x {args.turns} turns, {args.groups} shared system prompts, "
        f"{args.concurrency} at a time, through the door to 2 instances of the tiny model:"
    )
    print(
        f"  {'router policy':<14} {'requests':>8} {'prefix hit rate':>16} {'TTFT p50 ms':>12} "
        f"{'TTFT p99 ms':>12}"
    )
    for name, r in results.items():
        print(
            f"  {name:<14} {r['requests']:>8} {r['hit_rate']:>16.1%} {r['ttft_p50_ms']:>12.1f} "
            f"{r['ttft_p99_ms']:>12.1f}"
        )
    print(
        f"  cache_aware / round_robin: hit rate {ca['hit_rate'] / max(rr['hit_rate'], 1e-9):.2f}x, "
        f"TTFT p50 {ca['ttft_p50_ms'] / rr['ttft_p50_ms']:.2f}x"
    )
    d, g = lat["direct"], lat["door"]
    print(f"\none-token completions, {args.direct} each way, alternating:")
    print(f"  straight to lab1   p50 {statistics.median(d):7.2f} ms   p99 {pct(d, 0.99):7.2f} ms")
    print(f"  through the door   p50 {statistics.median(g):7.2f} ms   p99 {pct(g, 0.99):7.2f} ms")
    print(
        f"  the door adds      p50 {statistics.median(g) - statistics.median(d):7.2f} ms   "
        f"p99 {pct(g, 0.99) - pct(d, 0.99):7.2f} ms"
    )
    print(
        json.dumps(
            {
                "policies": results,
                "door_ms": {
                    "direct_p50": statistics.median(d),
                    "door_p50": statistics.median(g),
                    "direct_p99": pct(d, 0.99),
                    "door_p99": pct(g, 0.99),
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
