"""tune: the grid, the points, the Pareto front, the recommendation and the report, on hand-made results."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from vllm_fleet.core import benchmark, tune
from vllm_fleet.core.benchmark import BenchResult
from vllm_fleet.core.tune import MAX_POINTS, Outcome, TuneError, TunePoint, Workload

SVG = "{http://www.w3.org/2000/svg}"


def result(thr: float, p99_ttft: float, ok: bool = True, itl: float = 5.0) -> BenchResult:
    return BenchResult(successful=32 if ok else 0, failed=0 if ok else 32, duration_s=2.0,
                       request_throughput=thr / 16, output_throughput=thr, total_throughput=thr * 3,
                       mean_ttft_ms=p99_ttft / 2, median_ttft_ms=p99_ttft / 2, p99_ttft_ms=p99_ttft,
                       mean_tpot_ms=itl, mean_itl_ms=itl, p99_itl_ms=itl * 2)


def point(baseline: bool = False, **values) -> TunePoint:
    return TunePoint(tuple(values.items()), is_baseline=baseline)


def outcome(thr: float, lat: float, baseline: bool = False, ok: bool = True, **values) -> Outcome:
    return Outcome(point(baseline, **values), result(thr, lat, ok))


# --- the grid -------------------------------------------------------------------------------------------
def test_grid_values_are_typed_deduplicated_and_in_knob_order():
    grid = tune.parse_grid(["max-num-seqs=16,4,16", "max_num_batched_tokens=256,512",
                            "enable_prefix_caching=off,true", "gpu_memory_utilization=0.8,1"])
    assert grid == {"max_num_batched_tokens": [256, 512], "max_num_seqs": [16, 4],
                    "gpu_memory_utilization": [0.8, 1.0], "enable_prefix_caching": [False, True]}
    assert list(grid) == ["max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization",
                          "enable_prefix_caching"]
    assert type(grid["gpu_memory_utilization"][1]) is float
    assert type(grid["enable_prefix_caching"][0]) is bool


@pytest.mark.parametrize(("items", "message"), [
    (["max_num_seqs=x"], r"--grid max_num_seqs: 'x' is not an integer"),
    (["max_num_seqs=4.5"], r"max_num_seqs: '4.5' is not an integer"),
    (["gpu_memory_utilization=lots"], r"gpu_memory_utilization: 'lots' is not a number"),
    (["enable_prefix_caching=maybe"], r"enable_prefix_caching: 'maybe' is not a boolean"),
    # bounds are ServeFlags' own (max_num_seqs ge=1, max_model_len ge=16, gpu_memory_utilization le=1)
    (["max_num_seqs=4,0"], r"max_num_seqs: 0: .*greater than or equal to 1"),
    (["max_model_len=8"], r"max_model_len: 8: .*greater than or equal to 16"),
    (["gpu_memory_utilization=1.5"], r"gpu_memory_utilization: 1.5: .*less than or equal to 1"),
    (["max_num_seq=4"], r"'max_num_seq': not a tunable knob; did you mean max_num_seqs"),
    (["port=8001"], r"port: not a tunable knob \(tunable: max_num_batched_tokens"),
    (["max_num_seqs"], r"expected KNOB=V1,V2"),
    (["max_num_seqs=4,,8"], r"max_num_seqs: an empty value"),
    (["max_num_seqs=4", "max-num-seqs=8"], r"max_num_seqs: given twice"),
    ([], r"no knob given"),
])
def test_grid_errors_name_the_field(items, message):
    with pytest.raises(TuneError, match=message):
        tune.parse_grid(items)


def test_grid_is_capped_and_says_how_many():
    budgets = ",".join(str(16 * i) for i in range(1, 9))
    ok = tune.parse_grid(["max_num_seqs=1,2,3,4", f"max_num_batched_tokens={budgets}"])
    assert len(ok["max_num_seqs"]) * len(ok["max_num_batched_tokens"]) == MAX_POINTS
    too_many = rf"4 max_num_seqs x 3 max_model_len x 3 .* = 36 points; at most {MAX_POINTS}"
    with pytest.raises(TuneError, match=too_many):
        tune.parse_grid(["max_num_seqs=1,2,3,4", "max_model_len=512,1024,2048",
                         "max_num_batched_tokens=2048,4096,8192"])


def test_grid_refuses_a_knob_the_platform_ignores():
    with pytest.raises(TuneError, match="gpu_memory_utilization: has no effect on cpu hosts"):
        tune.parse_grid(["gpu_memory_utilization=0.8"], platform="cpu")
    assert tune.parse_grid(["gpu_memory_utilization=0.8"], platform="cuda")


def test_current_values_read_rendered_flags():
    rendered = {"model": "/m", "max-num-seqs": 64, "max-model-len": 2048, "no-enable-prefix-caching": True,
                "enable-chunked-prefill": True, "port": 8000}
    assert tune.current_values(rendered) == {"max_num_seqs": 64, "max_model_len": 2048,
                                             "enable_prefix_caching": False, "enable_chunked_prefill": True}


# --- workload ---------------------------------------------------------------------------------------------
def test_workload_args():
    args = tune.workload_args(Workload(input_len=64, output_len=8, num_prompts=10, request_rate=2.5,
                                       max_concurrency=4))
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs == {"--dataset-name": "random", "--random-input-len": "64", "--random-output-len": "8",
                     "--num-prompts": "10", "--seed": "0", "--request-rate": "2.5", "--max-concurrency": "4"}
    default = tune.workload_args(Workload())
    assert default[default.index("--request-rate") + 1] == "inf"
    assert "--max-concurrency" not in default
    assert default[default.index("--num-prompts") + 1] == "32"


def test_bench_args_are_unchanged_by_the_shared_dataset_part():
    assert benchmark.bench_args(benchmark.BenchSettings(), "http://127.0.0.1:8000", "tiny", "/m") == [
        "bench", "serve", "--backend", "openai", "--base-url", "http://127.0.0.1:8000", "--model", "tiny",
        "--tokenizer", "/m", "--dataset-name", "random", "--random-input-len", "32", "--random-output-len",
        "16", "--num-prompts", "16", "--seed", "0"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"input_len": 0}, "input_len"), ({"num_prompts": True}, "num_prompts"),
    ({"request_rate": 0}, "request_rate"), ({"max_concurrency": 0}, "max_concurrency"),
])
def test_workload_is_checked(kwargs, field):
    with pytest.raises(TuneError, match=f"workload {field}"):
        Workload(**kwargs)


# --- points -----------------------------------------------------------------------------------------------
def test_point_flags_and_label_follow_knob_order_and_render_flags_forms():
    p = tune._point({"enable_prefix_caching": False, "max_num_seqs": 16, "max_num_batched_tokens": 512,
                     "enable_chunked_prefill": True, "gpu_memory_utilization": 0.85})
    assert p.flags("0.32.0") == ["--max-num-batched-tokens", "512", "--max-num-seqs", "16",
                                 "--gpu-memory-utilization", "0.85", "--no-enable-prefix-caching",
                                 "--enable-chunked-prefill"]
    # 0.33 pairs --enable-x with --disable-x and hides --no-enable-x (data/parser.toml)
    assert "--disable-prefix-caching" in p.flags("0.34.0")
    assert tune.current_values({"disable-prefix-caching": True, "max-num-seqs": 16}) == {
        "max_num_seqs": 16, "enable_prefix_caching": False}
    assert p.label == ("max_num_batched_tokens=512 max_num_seqs=16 gpu_memory_utilization=0.85 "
                       "enable_prefix_caching=false enable_chunked_prefill=true")


def test_baseline_first_then_the_grid_without_the_baseline_combination():
    grid = {"max_num_batched_tokens": [512, 1024], "max_num_seqs": [16, 64]}
    pts, skipped = tune.points(grid, {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "port": 8000})
    assert skipped == []
    assert pts[0].is_baseline and pts[0].as_dict() == {"max_num_batched_tokens": 1024, "max_num_seqs": 64}
    assert [p.label for p in pts[1:]] == ["max_num_batched_tokens=512 max_num_seqs=16",
                                          "max_num_batched_tokens=512 max_num_seqs=64",
                                          "max_num_batched_tokens=1024 max_num_seqs=16"]
    assert not any(p.is_baseline for p in pts[1:])


def test_a_knob_at_vllms_default_has_no_override_in_the_baseline():
    pts, _ = tune.points({"max_num_batched_tokens": [512], "max_num_seqs": [16]}, {"max_num_seqs": 256})
    base = pts[0]
    assert base.flags("0.32.0") == ["--max-num-seqs", "256"]
    assert base.label == "max_num_batched_tokens=(vLLM default) max_num_seqs=256"
    assert len(pts) == 2  # the explicit 512/16 point is never the baseline


def test_combinations_vllm_refuses_are_skipped_with_the_reason():
    # max_model_len comes from the instance (not in the grid); chunked prefill is off there
    current = {"max_model_len": 1024, "enable_chunked_prefill": False, "max_num_seqs": 64}
    pts, skipped = tune.points({"max_num_batched_tokens": [32, 512, 2048]}, current)
    assert [p.label for p in pts] == ["max_num_batched_tokens=(vLLM default)",
                                      "max_num_batched_tokens=2048"]
    why = dict(skipped)
    assert "below max_model_len (1024) with enable_chunked_prefill off" in why["max_num_batched_tokens=512"]
    assert "below max_num_seqs (64)" in why["max_num_batched_tokens=32"]  # both rules, both named
    assert "below max_model_len (1024)" in why["max_num_batched_tokens=32"]
    assert "max_num_seqs" not in why["max_num_batched_tokens=512"]
    # with chunked prefill on (or vLLM's default, on) a small budget is fine, above max_num_seqs
    pts, skipped = tune.points({"max_num_batched_tokens": [512], "enable_chunked_prefill": [True]}, current)
    assert [p.label for p in pts][1:] == ["max_num_batched_tokens=512 enable_chunked_prefill=true"]


# --- pareto and recommend -----------------------------------------------------------------------------------
BASE = outcome(100, 200, baseline=True, max_num_seqs=256)
FAST = outcome(90, 120, max_num_seqs=16)       # lower latency, less throughput: on the front
BEST = outcome(150, 180, max_num_seqs=64)      # dominates BASE
SLOW = outcome(160, 400, max_num_seqs=1024)    # most throughput, over a 250 ms target
WORSE = outcome(80, 300, max_num_seqs=512)     # dominated by everything
DEAD = Outcome(point(max_num_seqs=2048), None, error="server died")
BROKEN = outcome(999, 1, ok=False, max_num_seqs=4)  # requests failed: never counts
ALL = [BASE, FAST, BEST, SLOW, WORSE, DEAD, BROKEN]


def test_pareto_drops_dominated_and_failed_points_and_sorts_by_latency():
    assert tune.pareto(ALL, "p99_ttft_ms") == [FAST, BEST, SLOW]


def test_pareto_keeps_ties_and_drops_a_point_beaten_on_one_count_only():
    twin = outcome(150, 180, max_num_seqs=32)
    same_thr_slower = outcome(150, 190, max_num_seqs=8)
    same_lat_less = outcome(140, 180, max_num_seqs=12)
    front = tune.pareto([BEST, twin, same_thr_slower, same_lat_less], "p99_ttft_ms")
    assert front == [BEST, twin]


def test_pareto_uses_the_chosen_metric():
    a = Outcome(point(max_num_seqs=1), result(100, 100, itl=9.0))
    b = Outcome(point(max_num_seqs=2), result(90, 200, itl=4.0))
    assert tune.pareto([a, b], "p99_ttft_ms") == [a]  # a: more tok/s and a lower p99 TTFT
    assert tune.pareto([a, b], "mean_itl_ms") == [b, a]
    with pytest.raises(TuneError, match="'p99_ttft': not a latency metric; did you mean p99_ttft_ms"):
        tune.pareto([a], "p99_ttft")


def test_recommend_the_most_throughput_within_the_target():
    rec = tune.recommend(ALL, "p99_ttft_ms", 250)
    assert rec is not None and rec.chosen is BEST and rec.baseline is BASE
    assert rec.gain == pytest.approx(0.5)
    assert rec.latency_change_ms == pytest.approx(-20)
    assert not rec.keep
    assert "+50.0% output throughput, -20.0 ms p99_ttft_ms" in rec.text
    # without a target the slow one wins; with a tight one only the fast one is left
    assert tune.recommend(ALL, "p99_ttft_ms", None).chosen is SLOW  # type: ignore[union-attr]
    assert tune.recommend(ALL, "p99_ttft_ms", 150).chosen is FAST  # type: ignore[union-attr]
    assert tune.recommend(ALL, "p99_ttft_ms", 50) is None


def test_recommend_ties_go_to_lower_latency_then_to_the_baseline():
    slower_twin = outcome(150, 190, max_num_seqs=32)
    assert tune.recommend([slower_twin, BEST], "p99_ttft_ms", None).chosen is BEST  # type: ignore[union-attr]
    base_twin = outcome(150, 180, baseline=True, max_num_seqs=256)
    rec = tune.recommend([BEST, base_twin], "p99_ttft_ms", None)
    assert rec is not None and rec.chosen is base_twin and rec.keep


def test_when_the_baseline_is_best_keep_the_inventorys_values():
    rec = tune.recommend([BASE, FAST, WORSE], "p99_ttft_ms", None)
    assert rec is not None and rec.keep and rec.gain == 0
    assert rec.text.startswith("keep the inventory's values")
    assert tune.inventory_diff("h", "i", {"max_num_seqs": 256}, rec.chosen.point) == ""


def test_no_gain_without_a_usable_baseline():
    broken_base = outcome(0, 0, baseline=True, ok=False, max_num_seqs=256)
    rec = tune.recommend([broken_base, FAST], "p99_ttft_ms", None)
    assert rec is not None and rec.chosen is FAST and rec.baseline is broken_base
    assert rec.gain is None and rec.latency_change_ms is None
    assert "no usable result to compare with" in rec.text


# --- diff, progress, table -----------------------------------------------------------------------------
def test_inventory_diff_changes_only_the_tuned_knobs():
    current = {"max_num_seqs": 256, "max_model_len": 2048, "gpu_memory_utilization": 0.9}
    chosen = point(max_num_batched_tokens=4096, max_num_seqs=64)
    diff = tune.inventory_diff("gpu1", "main", current, chosen)
    lines = diff.splitlines()
    assert lines[:2] == ["--- inventory: gpu1/main (now)", "+++ inventory: gpu1/main (recommended)"]
    assert sorted(ln for ln in lines if ln[:1] in "+-" and ln[:3] not in ("---", "+++")) == [
        "+  max_num_batched_tokens: 4096", "+  max_num_seqs: 64", "-  max_num_seqs: 256"]
    assert "   max_model_len: 2048" in lines and "   gpu_memory_utilization: 0.9" in lines
    assert " flags:" in lines
    assert current == {"max_num_seqs": 256, "max_model_len": 2048, "gpu_memory_utilization": 0.9}


def test_inventory_diff_writes_booleans_as_yaml():
    diff = tune.inventory_diff("h", "i", {"enable_prefix_caching": True}, point(enable_prefix_caching=False))
    assert "-  enable_prefix_caching: true" in diff and "+  enable_prefix_caching: false" in diff


def test_progress_lines():
    o = Outcome(point(max_num_batched_tokens=512, max_num_seqs=16), result(41.24, 180.33))
    assert tune.progress_line(3, 5, o, "p99_ttft_ms") == (
        "tune 3/5 max_num_batched_tokens=512 max_num_seqs=16: 41.2 out tok/s, p99_ttft_ms 180.3 ms, 32/0 ok")
    assert tune.progress_line(4, 5, DEAD, "p99_ttft_ms") == "tune 4/5 max_num_seqs=2048: failed: server died"
    assert tune.progress_line(5, 5, BROKEN, "p99_ttft_ms").endswith("0/32 FAILED")


def test_table_marks_baseline_pareto_recommended_and_failures():
    rec = tune.recommend(ALL, "p99_ttft_ms", 250)
    out = tune.table(ALL, "p99_ttft_ms", rec).splitlines()
    assert out[0].split() == ["POINT", "OK/FAIL", "REQ/S", "OUT", "TOK/S", "TTFT", "P99", "ITL", "MEAN",
                              "NOTE"]
    notes = {ln.split()[0]: ln for ln in out[1:]}
    assert notes["max_num_seqs=256"].endswith("baseline")
    assert notes["max_num_seqs=64"].endswith("pareto, recommended")
    assert notes["max_num_seqs=16"].endswith("pareto")
    assert notes["max_num_seqs=512"].endswith("32/0     5.00   80.0       300.0 ms  5.00 ms")
    assert notes["max_num_seqs=2048"].endswith("server died")
    assert notes["max_num_seqs=4"].endswith("requests failed")


# --- report -------------------------------------------------------------------------------------------
def report(outcomes, target, host="gpu<1>"):
    rec = tune.recommend(outcomes, "p99_ttft_ms", target)
    diff = "" if rec is None else tune.inventory_diff(host, "main", {"max_num_seqs": 256}, rec.chosen.point)
    return rec, tune.report_html(host, "main", "tiny-llama", "0.32.0", Workload(), "p99_ttft_ms", target,
                                 outcomes, rec, diff, "2025-06-01T10:00:00Z", 321.0,
                                 "lab: CPU build, tiny model — not a GPU figure",
                                 skipped=[("max_num_batched_tokens=32", "below max_num_seqs (64)")])


def svg_of(html: str) -> ET.Element:
    m = re.search(r"<svg.*?</svg>", html, re.S)
    assert m
    return ET.fromstring(m.group(0))


def test_report_page_holds_chart_recommendation_diff_and_table():
    rec, html = report(ALL, 250)
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<h1>vLLM tune: gpu&lt;1&gt;/main</h1>" in html
    assert "lab: CPU build, tiny model — not a GPU figure" in html
    root = svg_of(html)
    circles = {e.attrib["class"]: e for e in root.iter(f"{SVG}circle") if "data-label" in e.attrib}
    assert circles["recommended"].attrib["data-label"] == "max_num_seqs=64"
    assert circles["baseline"].attrib["data-label"] == "max_num_seqs=256"
    assert len([e for e in root.iter(f"{SVG}circle") if e.attrib.get("class") in ("point", "recommended",
                                                                                  "baseline")]) == 5
    assert len([e for e in root.iter(f"{SVG}polyline") if e.attrib["class"] == "frontier"]) == 1
    assert [e for e in root.iter(f"{SVG}line") if e.attrib.get("class") == "target"]
    failed = ["".join(e.itertext()) for e in root.iter(f"{SVG}text") if e.attrib.get("class") == "failed"]
    assert failed == ["failed: max_num_seqs=2048", "failed: max_num_seqs=4"]
    section = re.search(r'<section id="recommendation">(.*?)</section>', html, re.S)
    assert section and "max_num_seqs=64" in section.group(1) and "+50.0%" in section.group(1)
    assert "150.0 out tok/s" in section.group(1)
    diff = re.search(r'<pre id="diff">(.*?)</pre>', html, re.S)
    assert diff and "+  max_num_seqs: 64" in diff.group(1) and "gpu&lt;1&gt;/main (now)" in diff.group(1)
    table = re.search(r'<table id="trials">.*?</table>', html, re.S)
    assert table
    rows = ET.fromstring(table.group(0)).findall("./tbody/tr")
    assert len(rows) == len(ALL)
    assert [r for r in rows if r.attrib.get("class") == "recommended"][0][0].text == "max_num_seqs=64"
    assert "below max_num_seqs (64)" in html


def test_report_recommended_point_is_the_best_under_the_target():
    outcomes = [outcome(10 * i, 50 * i, baseline=i == 1, max_num_seqs=i) for i in range(1, 9)]
    for target in (120, 260, 399):
        _, html = report(outcomes, target)
        root = svg_of(html)
        (rec,) = [e for e in root.iter(f"{SVG}circle") if e.attrib.get("class") == "recommended"]
        within = [o for o in outcomes if o.result and o.result.p99_ttft_ms <= target]
        best = max(within, key=lambda o: o.result.output_throughput)  # type: ignore[union-attr]
        assert rec.attrib["data-label"] == best.point.label
        others = [e for e in root.iter(f"{SVG}circle") if e.attrib.get("class") in ("point", "baseline")]
        tx = float(next(e for e in root.iter(f"{SVG}line") if e.attrib.get("class") == "target").attrib["x1"])
        assert float(rec.attrib["cx"]) <= tx
        # nothing left of the target line sits higher (more throughput) than the recommendation
        left_of_target = [e for e in others if float(e.attrib["cx"]) <= tx]
        assert all(float(e.attrib["cy"]) >= float(rec.attrib["cy"]) for e in left_of_target)


def test_report_when_no_point_meets_the_target():
    rec, html = report(ALL, 10)
    assert rec is None
    section = re.search(r'<section id="recommendation">(.*?)</section>', html, re.S)
    assert section and "no point meets the target" in section.group(1)
    assert '<pre id="diff">(no change)</pre>' in html
    assert not [e for e in svg_of(html).iter(f"{SVG}circle") if e.attrib.get("class") == "recommended"]


def test_summary_is_json_ready():
    rec = tune.recommend(ALL, "p99_ttft_ms", 250)
    s = tune.summary("h", "main", "tiny", "0.32.0", Workload(), "p99_ttft_ms", 250, ALL, rec, wall_s=12.5)
    back = json.loads(json.dumps(s))
    assert back["recommendation"]["label"] == "max_num_seqs=64" and back["recommendation"]["gain"] == 0.5
    assert [p["pareto"] for p in back["points"]] == [False, True, True, True, False, False, False]
    assert back["points"][5]["result"] is None and back["points"][5]["error"] == "server died"
    assert back["workload"]["request_rate"] is None
