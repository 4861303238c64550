"""`vllm-fleet status`'s live columns from real /metrics captures of vLLM 0.32.0 (CPU build, the tiny
model, on this project's controller: tests/fixtures/metrics/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.host.metrics import GENERATED, KV_USAGE, RUNNING, STARTED, Live, duration, parse

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def capture(name: str) -> dict[str, float]:
    return parse((CAPTURES / f"vllm-0.32.0-cpu-{name}.txt").read_text())


def test_the_busy_capture_reads_as_vllm_printed_it():
    busy = capture("busy-t0")
    assert busy[RUNNING] == 48 and busy[GENERATED] == 5554
    assert busy[KV_USAGE] == pytest.approx(0.0029298663248489287)
    assert busy[STARTED] > 1.7e9


def test_rate_over_the_window_and_uptime_from_the_servers_own_clock():
    t0, t1 = capture("busy-t0"), capture("busy-t1")
    live = Live.of(t0, t1, window_s=1.2, server_time=t1[STARTED] + 3725)
    assert live.tokens_per_s == pytest.approx((12602 - 5554) / 1.2)
    assert (live.running, live.waiting, live.uptime_s) == (0, 0, pytest.approx(3725))
    assert live.cells() == ("0", "0", "0.0%", f"{(12602 - 5554) / 1.2:.1f}", "1h02m")


def test_idle_instance_and_a_counter_reset_never_show_negative_throughput():
    idle = capture("idle")
    assert Live.of(idle, idle, 2.0, None).cells() == ("0", "0", "0.0%", "0.0", "-")
    assert Live.of(capture("busy-t1"), idle, 2.0, None).tokens_per_s == 0.0  # restarted in between


def test_an_endpoint_without_vllm_metrics_shows_dashes():
    assert Live.of({}, {}, 2.0, None).cells() == ("-", "-", "-", "-", "-")


def test_several_engines_are_summed_and_comments_and_nan_skipped():
    text = ("# HELP vllm:num_requests_running x\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 4.0\n'
            "vllm:kv_cache_usage_perc NaN\n")
    assert parse(text) == {RUNNING: 7.0}


@pytest.mark.parametrize("s, text", [(5, "5s"), (185, "3m05s"), (7300, "2h01m"), (200_000, "2d07h")])
def test_durations_read_at_a_glance(s, text):
    assert duration(s) == text
