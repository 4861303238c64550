#!/usr/bin/env bash
# Type-check the package as it installs: vllm_fleet/ with the top-level roles/ as vllm_fleet.roles.
# setuptools maps roles/ there (pyproject.toml [tool.setuptools.package-dir]) and the editable install's
# import hook serves it, which mypy cannot follow; so mypy reads a throwaway tree of links that has the
# installed layout, and its messages are given back with the checkout's paths (roles/x.py, not
# vllm_fleet/roles/x.py). Settings: pyproject.toml [tool.mypy]. Extra arguments go to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=$(mktemp -d "${TMPDIR:-/tmp}/vllm-fleet-typecheck.XXXXXX")
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/vllm_fleet"
for f in vllm_fleet/*; do
  [ "${f##*/}" = __pycache__ ] || ln -s "$root/$f" "$tree/vllm_fleet/"
done
ln -s "$root/roles" "$tree/vllm_fleet/roles"
cd "$tree"
"$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.cache/mypy" \
  -p vllm_fleet "$@" 2>&1 | sed -e 's#^vllm_fleet/roles/#roles/#'
