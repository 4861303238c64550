#!/usr/bin/env bash
# The newcomer's first command: boot the lab, make the tiny model, deploy vLLM, show the smoke table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-env.sh
t0=$SECONDS
.venv/bin/vllm-fleet lab up "${LAB_HOSTS:-2}" --plain 1
.venv/bin/vllm-fleet model tiny >/dev/null
.venv/bin/python -m compileall -q vllm_fleet roles fleetlab  # see scripts/setup.sh: only what changed since
echo "demo: deploying vLLM (CPU build) to the lab; a first run installs the release (minutes), reruns take seconds"
t1=$SECONDS
.venv/bin/pyinfra -y fleetlab/inventories/lab.py deploys/vllm.py
echo "demo: deploy took $((SECONDS - t1)) s, demo $((SECONDS - t0)) s in all"
