#!/usr/bin/env python3
"""haproxy's runtime API for a rollout: drain servers, wait for their sessions to end, make them ready.

Runs ON the load-balancer host (stdlib only, Python >= 3.9), uploaded by deploys/lb.py to
/usr/local/lib/vllm-fleet/. Talks to the admin socket haproxy.cfg declares (root only).

    lbctl.py SOCKET drain SECONDS SERVER...   set drain; wait (bounded) until none has a session
    lbctl.py SOCKET ready SERVER...           set ready (haproxy sends traffic once its check passes)
    lbctl.py SOCKET tenants TABLE [URL]       one JSON object per tenant: its requests over 60 s; with
                                              URL (the door's /metrics/tenants) one more, its text
    lbctl.py SOCKET show                      one JSON object per server: state, admin state, check,
                                              sessions

Servers are "backend/server". A server haproxy does not have (a balancer not deployed yet, or not yet
listing it) gets no traffic from it: it is skipped and named under "unknown", not an error. drain and
ready print one JSON object. Exit 0 on success; 3 when sessions did not reach 0 in time (the servers
stay drained and the caller decides).
"""

from __future__ import annotations

import csv
import io
import json
import socket
import sys
import time
import urllib.request


def ask(path: str, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode()


def stats(path: str) -> dict[str, dict[str, str]]:
    """backend/server -> haproxy's stat row (scur: current sessions, status, check_status, ...)."""
    text = ask(path, "show stat").lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {f"{r['pxname']}/{r['svname']}": r for r in rows if r.get("svname") not in ("FRONTEND", "BACKEND")}


def admin_states(path: str) -> dict[str, str]:
    """backend/server -> "ready", "drain" or "maint", what an operator or a rollout set (haproxy's
    stat `status` shows DOWN instead while a check fails, whatever the admin state)."""
    lines = [line for line in ask(path, "show servers state").splitlines()
             if line.strip() and not line.startswith("#")]
    out = {}
    for line in lines[1:]:  # the first line is the format version
        f = line.split()
        adm = int(f[6])
        out[f"{f[1]}/{f[3]}"] = "maint" if adm & 0x67 else "drain" if adm & 0x18 else "ready"
    return out


def _known(path: str, servers: list[str]) -> tuple[list[str], list[str]]:
    try:
        have = stats(path)
    except OSError:  # no socket: haproxy is not running this config
        return [], servers
    return [s for s in servers if s in have], [s for s in servers if s not in have]


def _set(path: str, servers: list[str], state: str) -> None:
    for server in servers:
        answer = ask(path, f"set server {server} state {state}").strip()
        if answer:  # haproxy answers nothing on success
            sys.exit(f"haproxy refused 'set server {server} state {state}': {answer}")


def drain(path: str, timeout: float, servers: list[str]) -> int:
    servers, unknown = _known(path, servers)
    _set(path, servers, "drain")
    t0 = time.monotonic()
    while True:
        now = stats(path) if servers else {}
        busy = {s: int(now[s]["scur"] or 0) for s in servers if int(now[s]["scur"] or 0)}
        if not busy or time.monotonic() - t0 > timeout:
            print(json.dumps({"drained": servers, "unknown": unknown, "busy": busy,
                              "waited_s": round(time.monotonic() - t0, 2)}))
            return 3 if busy else 0
        time.sleep(0.2)


def ready(path: str, servers: list[str]) -> int:
    servers, unknown = _known(path, servers)
    _set(path, servers, "ready")
    print(json.dumps({"ready": servers, "unknown": unknown}))
    return 0


def show(path: str) -> int:
    admin = admin_states(path)
    for name, r in sorted(stats(path).items()):
        print(json.dumps({"server": name, "status": r["status"], "admin": admin.get(name, "?"),
                          "check": r.get("check_status", ""), "sessions": int(r["scur"] or 0),
                          "total": int(r["stot"] or 0)}))
    return 0


def tenants(path: str, table: str, url: str | None) -> int:
    """One JSON object per tenant the door has seen: requests over the last 60 s (the limit's
    window); then the door's own counts of requests and tokens, as Prometheus reads them."""
    for line in ask(path, f"show table {table}").splitlines():
        if line.startswith("#") or " key=" not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split(": ", 1)[-1].split() if "=" in f)
        rate = next((v for k, v in fields.items() if k.startswith("http_req_rate")), "0")
        print(json.dumps({"tenant": fields["key"], "rate_60s": int(rate)}))
    if url:
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (the door's own loopback URL)
            print(json.dumps({"metrics": r.read().decode()}))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.exit(__doc__)
    path, cmd, rest = argv[0], argv[1], argv[2:]
    if cmd == "drain" and len(rest) >= 2:
        return drain(path, float(rest[0]), rest[1:])
    if cmd == "ready" and rest:
        return ready(path, rest)
    if cmd == "show":
        return show(path)
    if cmd == "tenants" and len(rest) in (1, 2):
        return tenants(path, rest[0], rest[1] if len(rest) == 2 else None)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
