"""HTTP checks of a running vLLM: the four questions an operator asks after every change.

/health says the process is up, not that it serves: a tiny model with an unsupported head size answers
/health and /v1/models and then dies on the first completion. So the smoke test always sends a real
completion (ignore_eos + max_tokens makes the token count a firm assertion) and checks that the key is
enforced (401 without it).
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

import certifi
import httpx

from fleet.metrics import Live, parse
from fleet.tables import columns

SMOKE_TOKENS = 4


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's own default (certifi's CA bundle), built once per process: httpx builds one per Client,
    26-48 ms here, and a deploy made two Clients per host, one host after another (gevent, one thread)."""
    return ssl.create_default_context(cafile=certifi.where())


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
    except httpx.HTTPError as e:
        check = Check(fn.__name__.strip("_"), False, f"{type(e).__name__}: {e}")
    check.ms = (time.monotonic() - t0) * 1000
    return check


def run_checks(base_url: str, served_name: str, api_key: str | None, timeout: float = 60.0) -> list[Check]:
    """The smoke test proper; `api_key` None means the instance runs without a key (no 401 check)."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, timeout=timeout, verify=_tls()) as c:

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

        def unauthorized() -> Check:
            r = c.get("/v1/models")
            return Check("no-key-401", r.status_code == 401, f"HTTP {r.status_code} without key")

        checks = [_timed(health), _timed(models), _timed(completion)]
        if api_key:
            checks.append(_timed(unauthorized))
        return checks


LIVE_WINDOW_S = 2.0


def read_live(base_url: str, window_s: float = LIVE_WINDOW_S) -> Live | None:
    """Two reads of /metrics `window_s` apart (vLLM serves it without the key); None if it has none."""
    try:
        with httpx.Client(base_url=base_url, timeout=10.0, verify=_tls()) as c:
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
                 interval: float = 1.0) -> tuple[bool, float]:
    """Poll /health with a bound. `alive` lets the caller stop early when the unit has failed for good."""
    t0 = time.monotonic()
    with httpx.Client(base_url=base_url, timeout=5.0, verify=_tls()) as c:
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
            return ("ok" if c.ok else "FAIL") + (f" ({c.detail})" if name in ("completion", "config") and c.ok
                                                 else "")

        rows.append((r.host, r.instance, r.model, str(r.tp), r.release, cell("health"), cell("models"),
                     cell("completion"), cell("no-key-401"), cell("config"),
                     f"{r.latency_ms:.0f} ms" if "completion" in by else "-",
                     ("ok" if r.ok else "FAILED: " + r.failures()) + (f" ({r.note})" if r.note else "")))
    return columns(head, rows)
