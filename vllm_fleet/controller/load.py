"""Bounded client load for rollout tests and benches: a fixed request rate of small completions,
each counted and timed, stopping by itself (a count and a wall-clock bound). Controller side.

Sends only to the address it is given (a lab load balancer); never retries, so every failure a
client would see is counted.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Sample:
    t: float  # seconds since the load started
    ok: bool
    ms: float
    detail: str = ""


@dataclass
class Load:
    url: str
    served_name: str
    api_key: str
    rate_per_s: float = 4.0
    max_requests: int = 2000
    max_s: float = 900.0
    max_tokens: int = 8
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _one(self, client: httpx.Client, t0: float) -> None:
        start = time.monotonic()
        body = {"model": self.served_name, "prompt": "Hello", "max_tokens": self.max_tokens,
                "ignore_eos": True}
        try:
            r = client.post("/v1/completions", json=body)
            ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == self.max_tokens
            detail = "" if ok else f"HTTP {r.status_code}: {r.text[:120]}"
        except (httpx.HTTPError, ValueError, KeyError) as e:
            ok, detail = False, f"{type(e).__name__}: {e}"[:160]
        with self._lock:
            self.samples.append(Sample(start - t0, ok, (time.monotonic() - start) * 1000, detail))

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)  # a new connection each
        with httpx.Client(base_url=self.url, headers=headers, timeout=120.0, limits=limits) as client:
            t0 = time.monotonic()
            for n in range(self.max_requests):
                due = t0 + n / self.rate_per_s
                while (wait := due - time.monotonic()) > 0:
                    if self._stop.wait(min(wait, 0.5)):
                        break
                if self._stop.is_set() or time.monotonic() - t0 > self.max_s:
                    break
                th = threading.Thread(target=self._one, args=(client, t0), daemon=True)
                th.start()
                self._threads.append(th)
            for th in self._threads:
                th.join(timeout=130)

    def start(self) -> Load:
        self._runner = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()
        self._runner.start()
        return self

    def mark(self) -> float:
        """Seconds since start: to split the samples into before and during."""
        return time.monotonic() - self._t0

    def stop(self) -> None:
        self._stop.set()
        self._runner.join(timeout=200)


def summary(samples: list[Sample]) -> dict[str, float | int]:
    ms = sorted(s.ms for s in samples if s.ok)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))] if ms else float("nan")

    return {"sent": len(samples), "failed": sum(not s.ok for s in samples),
            "p50_ms": statistics.median(ms) if ms else float("nan"), "p99_ms": pct(99)}
