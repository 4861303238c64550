#!/usr/bin/env python3
"""Make the README's dashboard picture on the lab: lab1 (vLLM's CPU build, the tiny model) serving on
the lab network, a real Prometheus scraping it with the generated rules, a few minutes of varying load,
then `vllm-fleet preview` of the generated dashboard screenshot in headless Chromium.

    source scripts/lab-env.sh; .venv/bin/python scripts/lab_pictures.py --minutes 4 --out docs/images

lab1 is deployed back to the lab's own settings afterwards. The tune report's picture comes from
`VLLM_FLEET_ARTIFACTS=DIR make test` (tests/hosts/test_tune_lab.py writes it there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fleetlab as lab  # noqa: E402
from tests.browser import FLAGS  # noqa: E402  (the tests' own Chromium flags)

BIN = Path(sys.executable).parent
INVENTORY = str(ROOT / "tests" / "hosts" / "inventory.py")
BOUND = {"lab1": {"flags": {"host": "0.0.0.0"}, "open_paths": ["/health", "/metrics"]}}



def run(*args: str, overrides: dict | None = None) -> None:
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(overrides or {})}
    out = subprocess.run(list(args), cwd=ROOT, env=env, text=True, capture_output=True)
    if out.returncode:
        sys.exit(f"{' '.join(args[:3])} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")


def load(url: str, key: str, until: float) -> int:
    """Waves of 1 to 6 clients, some streaming, some sharing a prompt prefix: every panel moves."""
    sent = 0
    lock = threading.Lock()

    def client(stop: float) -> None:
        nonlocal sent
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as c:
            while time.monotonic() < stop:
                prompt = "You are the fleet's assistant. " * 4 + random.choice(["hi", "status?", "sum"])
                c.post(url, json={"model": "tiny-llama", "prompt": prompt, "stream": random.random() < 0.5,
                                  "max_tokens": random.randint(8, 48)})
                with lock:
                    sent += 1

    while time.monotonic() < until:
        wave = min(until, time.monotonic() + 30)
        threads = [threading.Thread(target=client, args=(wave,)) for _ in range(random.randint(1, 6))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return sent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=int, default=4)
    ap.add_argument("--out", default="docs/images")
    args = ap.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    key = os.environ["VLLM_API_KEY"]
    print("deploying lab1 on the lab network", flush=True)
    run(str(BIN / "pyinfra"), "-y", "--limit", "lab1", INVENTORY, "deploys/vllm.py", overrides=BOUND)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            run(str(BIN / "vllm-fleet"), "targets", INVENTORY, "--output", str(t / "vllm.json"),
                overrides=BOUND)
            run(str(BIN / "vllm-fleet"), "dashboards", INVENTORY, "--limit", "lab1", "--output", tmp,
                overrides=BOUND)
            (t / "prometheus.yml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
                "rule_files": [str(t / "vllm-fleet-rules.yml")],
                "scrape_configs": [{"job_name": "vllm",
                                    "file_sd_configs": [{"files": [str(t / "vllm.json")]}]}],
            }))
            prom = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={t / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={t / 'data'}",
                                     "--web.listen-address=127.0.0.1:19090"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(5)
                url = f"http://{lab.LabHost(1).address}:8000/v1/completions"
                print(f"load for {args.minutes} min", flush=True)
                sent = load(url, key, time.monotonic() + args.minutes * 60)
                time.sleep(10)
                page = t / "dashboard.html"
                run(str(BIN / "vllm-fleet"), "preview", str(t / "vllm-fleet-dashboard.json"), "--prometheus",
                    "http://127.0.0.1:19090", "--minutes", str(args.minutes + 1), "--output", str(page))
                with tempfile.TemporaryDirectory() as profile:
                    subprocess.run(["chromium", *FLAGS, f"--user-data-dir={profile}",
                                    "--window-size=1000,1420",
                                    f"--screenshot={out / 'dashboard.png'}", page.as_uri()],
                                   capture_output=True, timeout=120)
                print(f"{sent} requests; {out / 'dashboard.png'}")
            finally:
                prom.terminate()
                prom.wait(timeout=30)
    finally:
        print("deploying lab1 back", flush=True)
        run(str(BIN / "pyinfra"), "-y", "--limit", "lab1", INVENTORY, "deploys/vllm.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
