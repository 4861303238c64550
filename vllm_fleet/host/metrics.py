"""What an instance is doing now, from two reads of vLLM's own /metrics (Prometheus text format).

Stdlib only: the watchdog (vllm_fleet/host/watchdog.py) uses it on the host too, uploaded beside it.

Why two reads: generation throughput is a counter, so a rate needs two samples; everything else is a
gauge read from the second one. Uptime comes from the API server's `process_start_time_seconds`
against the same response's HTTP `Date` header, both the host's clock, so a controller whose clock is
off does not make it wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

# name{labels} value [timestamp]
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction, 0..1, despite the name
GENERATED = "vllm:generation_tokens_total"
PROMPTED = "vllm:prompt_tokens_total"
STARTED = "process_start_time_seconds"


def parse(text: str) -> dict[str, float]:
    """Sum of every series of each metric name (one engine per instance here; a data-parallel one has
    several `engine` labels, whose sum is the instance's)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@dataclass(frozen=True)
class Live:
    running: int | None
    waiting: int | None
    kv_usage: float | None  # fraction of the KV cache in use
    tokens_per_s: float | None  # generated tokens per second over the window
    uptime_s: float | None
    window_s: float

    @classmethod
    def of(cls, first: Mapping[str, float], second: Mapping[str, float], window_s: float,
           server_time: float | None) -> Live:
        def count(name: str) -> int | None:
            return int(second[name]) if name in second else None

        rate = None
        if GENERATED in first and GENERATED in second and window_s > 0:
            rate = max(0.0, second[GENERATED] - first[GENERATED]) / window_s
        uptime = None
        if server_time is not None and STARTED in second:
            uptime = max(0.0, server_time - second[STARTED])
        return cls(count(RUNNING), count(WAITING), second.get(KV_USAGE), rate, uptime, window_s)

    def cells(self) -> tuple[str, str, str, str, str]:
        """RUNNING, WAITING, KV CACHE, GEN TOK/S, UPTIME for the status table; '-' where vLLM said nothing."""
        return (_or_dash(self.running), _or_dash(self.waiting),
                "-" if self.kv_usage is None else f"{self.kv_usage * 100:.1f}%",
                "-" if self.tokens_per_s is None else f"{self.tokens_per_s:.1f}",
                "-" if self.uptime_s is None else duration(self.uptime_s))


LIVE_HEAD = ("RUNNING", "WAITING", "KV CACHE", "GEN TOK/S", "UPTIME")


def _or_dash(v: object) -> str:
    return "-" if v is None else str(v)


def duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172_800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
