"""Restart downtime of a hub revision change: the deploy's fetch before the restart against vLLM
downloading the revision when it starts (how an `hf_repo` model was served before), same model, same host,
same link, one run.

  python bench/hub_downtime.py [--host lab2] [--rate 2mbit]

Needs a deployed lab (`make demo`). Starts the lab's hub mirror (olah, fleetlab/hubmirror.py) and slows
the controller's link to the host to --rate (tc tbf), so that the tiny model's 1.9 MB take seconds to
come, as a large model's weights take minutes on a real link. Polls /health every 0.2 s on the host.

1. fetch before restart: the deploy changes the revision (the old service serves during the fetch);
2. download at start: the same change made by hand the way vLLM downloads it, config naming the
   repository and revision, HF_HUB_OFFLINE unset, HF_ENDPOINT the mirror, the cache emptied first.
The host is deployed back to its inventory's model at the end.
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
from fleetlab import hubmirror  # noqa: E402
from fleetlab.probe import HealthPoll, slow_link  # noqa: E402

CACHE = "/var/lib/vllm/hf/hub/models--" + hubmirror.REPO.replace("/", "--")


def on(host: lab.LabHost, cmd: str) -> str:
    return lab.ssh(host, cmd, timeout=600).stdout


def deploy(name: str, over: dict) -> str:
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(over)}
    proc = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "--limit", name,
                           str(ROOT / "tests/hosts/inventory.py"), "deploys/vllm.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-2000:])
    return proc.stdout + proc.stderr


def hub_over(name: str, url: str, revision: str) -> dict:
    return {name: {"hf_endpoint": url, "model": {"name": "tiny-llama", "path": None,
                                                  "hf_repo": hubmirror.REPO, "revision": revision}}}


def outage(host: lab.LabHost, change) -> tuple[float, str]:
    """Seconds of non-200 /health while `change()` runs (and until the host answers again)."""
    poll = HealthPoll(host)
    poll.start()
    out = change()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not poll.last().endswith(" 200"):
        time.sleep(1)
    down = [t for t, code in poll.stop() if code != "200"]
    return ((max(down) - min(down) + 0.2) if down else 0.0), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="lab2")
    ap.add_argument("--rate", default="2mbit", help="the link's rate to the host while changing (tc tbf)")
    args = ap.parse_args()
    host = lab.LabHost(int(args.host.removeprefix("lab")))
    mirror = hubmirror.start(lab.LAB_DIR / "hub")
    try:
        first, second = mirror.shas
        on(host, f"rm -rf {CACHE}")
        deploy(args.host, hub_over(args.host, mirror.url, first))  # the starting point, fetched unthrottled
        with slow_link(host, args.rate):
            fetch_s, out = outage(host, lambda: deploy(args.host, hub_over(args.host, mirror.url, second)))
            took = re.search(r"fetch \S+: [\d.]+ \w+ of [\d.]+ \w+ \(100%\), [\d.]+ MiB/s, (\d+) s", out)
            # the same change as vLLM makes it when it downloads at start
            on(host, f"rm -rf {CACHE}; sed -i -e 's#^model: .*#model: {hubmirror.REPO}#' "
                     f"-e '$a revision: {first}' /etc/vllm/default.yaml; "
                     f"sed -i -e '/^HF_HUB_OFFLINE=/d' -e '$a HF_ENDPOINT=\"{mirror.url}\"' "
                     "/etc/vllm/default.environment")
            start_s, _ = outage(host, lambda: on(host, "systemctl restart vllm-default"))
        print(f"hub revision change on {args.host} (vLLM CPU build, tiny model 1.9 MB, link {args.rate}):")
        print(f"  fetch before restart: non-200 /health for {fetch_s:.1f} s"
              + (f" (the fetch itself took {took.group(1)} s, old service serving)" if took else ""))
        print(f"  vLLM downloads at start: non-200 /health for {start_s:.1f} s")
        if fetch_s:
            print(f"  ratio (download at start / fetch before restart): {start_s / fetch_s:.2f}x")
    finally:
        deploy(args.host, {})  # back to the inventory's own model
        mirror.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
