"""HTTP checks of a running vLLM: the four questions an operator asks after every change.

/health says the process is up, not that it serves: a tiny model with an unsupported head size answers
/health and /v1/models and then dies on the first completion. So the smoke test always sends a real
completion (ignore_eos + max_tokens makes the token count a firm assertion) and checks that the key is
enforced (401 without it): after a restart on every route the installed vLLM registers, as the host
lists them from vLLM's own app (vllm_fleet/host/keyguard.py `routes`), since vLLM's own check skips
/invocations.
"""

from __future__ import annotations

import functools
import re
import ssl
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import certifi
import httpx

from vllm_fleet.core.tables import columns
from vllm_fleet.host.metrics import Live, parse

if TYPE_CHECKING:
    from vllm_fleet.core.hostfacts import ListenerFacts

SMOKE_TOKENS = 4


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's own default (certifi's CA bundle), built once per process: httpx builds one per Client,
    and a deploy makes several Clients per host, one host after another (gevent, one thread)."""
    return ssl.create_default_context(cafile=certifi.where())


def _client(base_url: str, transport: httpx.BaseTransport | None, **kw: Any) -> httpx.Client:
    """A client for base_url. A given transport (roles/tunnel.py: HTTP over an SSH channel) makes its
    own connections, so no TLS context is built for it: loading the CA bundle is work such a client
    never uses."""
    if transport is not None:
        return httpx.Client(base_url=base_url, transport=transport, **kw)
    return httpx.Client(base_url=base_url, verify=_tls(), **kw)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    ms: float = 0.0


@dataclass
class SmokeResult:
    host: str
    instance: str
    model: str
    tp: int
    release: str
    checks: list[Check] = field(default_factory=list)
    note: str = ""  # e.g. "rolled back to 0.31.0-cpu"
    changed: bool = False  # the deploy changed this host (and restarted what it had to)
    live: Live | None = None  # `vllm-fleet status`: what /metrics says now

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def latency_ms(self) -> float:
        return sum(c.ms for c in self.checks if c.name == "completion")

    def failures(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)

    def as_dict(self) -> dict:
        return {"host": self.host, "instance": self.instance, "ok": self.ok, "model": self.model,
                "release": self.release, "tp": self.tp, "note": self.note, "changed": self.changed,
                "checks": [c.__dict__ for c in self.checks],
                "live": self.live.__dict__ if self.live else None}


def _timed(fn: Callable[[], Check]) -> Check:
    t0 = time.monotonic()
    try:
        check = fn()
    except httpx.HTTPError as e:  # named as the check's own result names it: no_key_401 -> no-key-401
        check = Check(fn.__name__.replace("_", "-"), False, f"{type(e).__name__}: {e}")
    check.ms = (time.monotonic() - t0) * 1000
    return check


_WILDCARD = ("*", "0.0.0.0", "::")
HOLDER_CHECK = "listener"  # the check that decides whether the key may be sent at all


def holder_check(listeners: list[ListenerFacts] | None, address: str, port: int, unit: str) -> Check | None:
    """Who listens where the smoke test connects (address:port on the host), read just before the key
    is sent: None when every listener that could take the connection is the unit's own process. During a
    restart the port is free for a moment, and a local user who binds it first would otherwise receive
    the smoke test's key; so any other holder, or a host that cannot tell, fails the check and the key is
    never sent. A listener on the same port at another specific address cannot take the connection."""
    if listeners is None:
        return Check(HOLDER_CHECK, False, f"cannot tell who holds port {port} (ss printed nothing): "
                                        "the key was not sent")
    on_port = [entry for entry in listeners if entry.get("port") == port
               and str(entry.get("address")).removeprefix("::ffff:") in (address, *_WILDCARD)]
    if not on_port:
        return Check(HOLDER_CHECK, False, f"nothing listens on port {port}: the key was not sent")
    others = [entry for entry in on_port if entry.get("unit") != unit]
    if others:
        who = ", ".join(f"{e.get('process') or '?'} (pid {e.get('pid') or '?'}, {e.get('unit') or 'no unit'})"
                        f" on {e.get('address')}" for e in others)
        return Check(HOLDER_CHECK, False, f"port {port} is held by {who}, not {unit}: the key was not sent")
    return None


def crashed(unit: Mapping[str, str]) -> bool:
    """From `systemctl show -p ActiveState -p SubState -p NRestarts` of a unit a deploy just started:
    failed, exited and waiting out its RestartSec= (auto-restart), or restarted by systemd since: either
    way the process the deploy started will not get ready, and waiting for it only delays the rollback.
    Newer systemd words the wait as dead-before-auto-restart, failed-before-auto-restart and
    auto-restart-queued too."""
    return (unit.get("ActiveState") == "failed" or "auto-restart" in unit.get("SubState", "")
            or unit.get("NRestarts", "0") not in ("0", ""))


def withheld(checks: Sequence[Check]) -> bool:
    """The holder check refused: nothing with the key goes to this port in this check, however it goes
    on (the live /metrics reads of `vllm-fleet status` included)."""
    return any(c.name == HOLDER_CHECK for c in checks)


def stands(first: Sequence[Check]) -> bool:
    """Whether a settled instance's first round of checks is its result: only when its health check
    answered 200. A round cut short before any request (nothing listening yet, so the key was not sent)
    or a failed /health may be a restart still under way, which the bounded wait for /health is for."""
    return any(c.name == "health" and c.ok for c in first)


def run_checks(base_url: str, served_name: str, api_key: str | None, timeout: float = 60.0,
               transport: httpx.BaseTransport | None = None) -> list[Check]:
    """The smoke test proper; `api_key` None means the instance runs without a key (no 401 check).
    `transport` carries the requests (roles/tunnel.py: a channel per request, no local
    listener)."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with _client(base_url, transport, timeout=timeout) as c:

        def health() -> Check:
            r = c.get("/health")
            return Check("health", r.status_code == 200, f"HTTP {r.status_code}")

        def models() -> Check:
            r = c.get("/v1/models", headers=auth)
            if r.status_code != 200:
                return Check("models", False, f"HTTP {r.status_code}")
            names = [m.get("id") for m in r.json().get("data", [])]
            return Check("models", served_name in names, f"serves {names}")

        def completion() -> Check:
            r = c.post("/v1/completions", headers=auth, json={
                "model": served_name, "prompt": "The fleet is", "max_tokens": SMOKE_TOKENS,
                "ignore_eos": True, "temperature": 0,
            })
            if r.status_code != 200:
                return Check("completion", False, f"HTTP {r.status_code}: {r.text[:200]}")
            n = r.json().get("usage", {}).get("completion_tokens", 0)
            return Check("completion", n >= 1, f"{n} tokens")

        def no_key_401() -> Check:
            r = c.get("/v1/models")
            return Check("no-key-401", r.status_code == 401, f"HTTP {r.status_code} without key")

        asks = [health, models, completion, *([no_key_401] if api_key else [])]
        # independent requests, each on a channel of its own: sent at once, the test takes as long as its
        # slowest check (the completion), not their sum; greenlets under pyinfra's gevent patching
        with ThreadPoolExecutor(len(asks)) as pool:
            return list(pool.map(_timed, asks))


# the route every instance has that runs a completion outside vLLM's own key check: probed first, and
# nothing else is sent unless it is refused (an unguarded server gets no request that changes it)
SENTINEL = "/invocations"
_WS = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
       "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def probes(routes: Iterable[Mapping], open_paths: Collection[str]) -> list[tuple[str, str, str]]:
    """(kind, method, path) to send without the key, one per route that is not open: POST with an empty
    JSON body where the route takes POST, GET otherwise; path parameters filled with a placeholder; a
    mount also below its path (vLLM's /metrics mount matches any suffix)."""
    out: list[tuple[str, str, str]] = []
    for r in routes:
        path = re.sub(r"\{[^}]*\}", "smoke", str(r["path"]))
        methods = set(r.get("methods") or ())
        kind = str(r.get("kind", "http"))
        if kind == "websocket":
            cands = [("websocket", "GET", path)]
        elif kind == "mount":
            cands = [("http", "GET", path), ("http", "GET", path.rstrip("/") + "/smoke")]
        else:
            method = "POST" if "POST" in methods else "GET" if "GET" in methods or not methods \
                else sorted(methods)[0]
            cands = [("http", method, path)]
        out += [c for c in cands if c[2] not in open_paths and c not in out]
    sentinel = [p for p in out if p[2] == SENTINEL]
    return sentinel + [p for p in out if p[2] != SENTINEL]


GUARD_CONCURRENCY = 8


def guard_check(base_url: str, routes: Sequence[Mapping], open_paths: Collection[str],
                timeout: float = 30.0, transport: httpx.BaseTransport | None = None) -> Check:
    """401 without the key on every route but the open ones (a websocket may also be refused with 403,
    a handshake closed before accept). No route list, or one without /invocations, is a failure."""
    todo = probes(routes, open_paths)
    if not any(p[2] == SENTINEL for p in todo):
        return Check("no-key-401", False, f"the host listed no {SENTINEL} route ({len(todo)} listed)")
    with _client(base_url, transport, timeout=timeout) as c:

        def refusal(probe: tuple[str, str, str]) -> tuple[bool, str] | None:
            """None when refused as it must be; else (whether it answered, what went wrong)."""
            kind, method, path = probe
            try:
                if kind == "websocket":
                    code = c.get(path, headers=_WS).status_code
                    ok = code in (401, 403)
                else:
                    code = c.request(method, path, json={} if method == "POST" else None).status_code
                    ok = code == 401
            except httpx.HTTPError as e:
                return False, f"{method} {path}: {type(e).__name__}"
            return None if ok else (True, f"{method} {path}: HTTP {code} without the key")

        found = [refusal(todo[0])]  # the sentinel, alone: when it answers, nothing more is sent
        if not (found[0] and found[0][0]):
            # the others are independent, each on a channel of its own: sent a few at a time
            with ThreadPoolExecutor(GUARD_CONCURRENCY) as pool:
                found += pool.map(refusal, todo[1:])
    bad = [f[1] for f in found if f is not None]
    if bad:
        return Check("no-key-401", False, f"{len(bad)} of {len(todo)} routes answer without the key: "
                     + "; ".join(bad[:5]) + ("; ..." if len(bad) > 5 else ""))
    return Check("no-key-401", True, f"401 on {len(todo)}/{len(todo)} routes")


LIVE_WINDOW_S = 2.0


def read_live(base_url: str, window_s: float = LIVE_WINDOW_S, api_key: str | None = None,
              transport: httpx.BaseTransport | None = None) -> Live | None:
    """Two reads of /metrics `window_s` apart (with the key: /metrics is open only if the inventory
    says so); None if it has none."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with _client(base_url, transport, timeout=10.0, headers=auth) as c:
            first = c.get("/metrics")
            t0 = time.monotonic()
            time.sleep(window_s)  # cooperative under pyinfra's gevent
            second = c.get("/metrics")
            took = time.monotonic() - t0
    except httpx.HTTPError:
        return None
    if first.status_code != 200 or second.status_code != 200:
        return None
    try:
        server_time = parsedate_to_datetime(second.headers["date"]).timestamp()
    except (KeyError, TypeError, ValueError):
        server_time = None
    return Live.of(parse(first.text), parse(second.text), took, server_time)


def wait_healthy(base_url: str, timeout_s: float, alive: Callable[[], bool] | None = None,
                 interval: float = 1.0, transport: httpx.BaseTransport | None = None) -> tuple[bool, float]:
    """Poll /health with a bound. `alive` lets the caller stop early when the unit has failed for good."""
    t0 = time.monotonic()
    with _client(base_url, transport, timeout=5.0) as c:
        while time.monotonic() - t0 < timeout_s:
            try:
                if c.get("/health").status_code == 200:
                    return True, time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if alive is not None and not alive():
                return False, time.monotonic() - t0
            time.sleep(interval)
    return False, time.monotonic() - t0


def table(results: Iterable[SmokeResult]) -> str:
    """A per-host table a person can read at the end of a deploy."""
    head = ("HOST", "INSTANCE", "MODEL", "TP", "RELEASE", "HEALTH", "MODELS", "COMPLETION", "401",
            "CONFIG", "LATENCY", "RESULT")
    rows = []
    for r in results:
        by = {c.name: c for c in r.checks}

        def cell(name: str, by: dict[str, Check] = by) -> str:
            c = by.get(name)
            if c is None:
                return "-"
            shown = ("completion", "config", "no-key-401")
            return ("ok" if c.ok else "FAIL") + (f" ({c.detail})" if name in shown and c.ok else "")

        rows.append((r.host, r.instance, r.model, str(r.tp), r.release, cell("health"), cell("models"),
                     cell("completion"), cell("no-key-401"), cell("config"),
                     f"{r.latency_ms:.0f} ms" if "completion" in by else "-",
                     ("ok" if r.ok else "FAILED: " + r.failures()) + (f" ({r.note})" if r.note else "")))
    return columns(head, rows)
