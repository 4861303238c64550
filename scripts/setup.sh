#!/usr/bin/env bash
# Install what the controller needs: Debian tools for the lab, and the project in a venv.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
need=()
# git: the lab's hub mirror serves git repositories (fleetlab/hubmirror.py); tc: bench/hub_downtime.py
for pair in debootstrap:debootstrap systemd-nspawn:systemd-container ssh:openssh-client \
            ssh-keygen:openssh-client ip:iproute2 zstd:zstd systemd-analyze:systemd git:git tc:iproute2; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing tools; as root run: apt-get install -y ${need[*]}" >&2; exit 2
  fi
  echo "setup: apt-get install ${need[*]}"
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The lab tests' real Prometheus (tests/hosts/test_prometheus.py runs its own process on a free port).
# The package's service is kept from starting (policy-rc.d) and from boot, so nothing holds :9090 or
# scrapes in the background; a machine that already has prometheus is left as it is.
if ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: note: the lab tests need prometheus; as root run:" \
         "apt-get install -y --no-install-recommends prometheus" >&2
  else
    echo "setup: apt-get install prometheus (its service disabled)"
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      policy=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    fi
    ok=0
    apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null && ok=1
    [ -n "$policy" ] && rm -f "$policy"
    [ "$ok" = 1 ] || { echo "setup: installing prometheus failed" >&2; exit 1; }
    systemctl disable --now prometheus >/dev/null 2>&1 || true  # no systemd running: nothing started
  fi
fi
# Headless Chromium (Debian's package): the lab tests open the dashboard preview and the tune report as
# a person would, screenshot them and check the picture.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: note: the lab tests need chromium; as root run:" \
         "apt-get install -y --no-install-recommends chromium fonts-dejavu-core" >&2
  else
    echo "setup: apt-get install chromium"
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null \
      || { echo "setup: installing chromium failed" >&2; exit 1; }
  fi
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
# pyinfra's CLI sets sys.dont_write_bytecode, so an editable install's modules were compiled from source
# on every run (46 ms of a 1.0 s no-op deploy); compiled here they are read, and recompiled if edited
.venv/bin/python -m compileall -q vllm_fleet roles fleetlab
echo "setup: done in $((SECONDS - t0)) s"
