#!/usr/bin/env bash
# The whole suite. The fast tiers run first so a broken core fails in seconds, not after a lab boot.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lab-env.sh
t0=$SECONDS
.venv/bin/ruff check . || exit 1
bash scripts/typecheck.sh || exit 1
.venv/bin/pytest -q -rfEP -p no:cacheprovider tests/unit tests/facts || exit 1
echo "test: fast tiers in $((SECONDS - t0)) s"
t1=$SECONDS
.venv/bin/pytest -v -rfEP -p no:cacheprovider --durations=40 tests/hosts
rc=$?
echo "test: lab tiers in $((SECONDS - t1)) s (exit $rc); total $((SECONDS - t0)) s"
[ "$rc" = 5 ] && { echo "test: no lab test was collected" >&2; exit 1; }
exit $rc
