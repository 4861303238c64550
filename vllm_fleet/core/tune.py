"""`vllm-fleet tune`: which serve flags give one instance the most output throughput within a latency target.

Pure: roles/ drains the canary instance, starts one trial server per point with the point's flags over the
instance's own config, and runs `vllm bench serve` against it; this module reads the grid, lists the points,
picks one and writes the report. The instance's current values are measured too (the baseline, first),
so the recommendation is a measured gain on the same host, release and workload, never a guess.

Values are checked by ServeFlags itself (its bounds are the one definition of each flag), and a point
vLLM would refuse to start is dropped before it costs a server start. Nothing here edits the inventory:
the result is a diff for the operator to apply.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from html import escape
from typing import get_args

from pydantic import ValidationError

from vllm_fleet.core import svgplot
from vllm_fleet.core.benchmark import BenchResult, dataset_args
from vllm_fleet.core.flags import Scalar, ServeFlags, did_you_mean, field_of, flag_meta, put_flag
from vllm_fleet.core.tables import columns

Value = int | float | bool
# the order of every label, flag list and diff
KNOBS = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "gpu_memory_utilization",
         "enable_prefix_caching", "enable_chunked_prefill")
# each point is a server start (a model load) and a benchmark run on a drained instance
MAX_POINTS = 32
# metric name -> BenchResult attribute (the same names: the report and --latency use them)
LATENCY_METRICS = {name: name for name in ("p99_ttft_ms", "mean_ttft_ms", "median_ttft_ms", "mean_itl_ms",
                                           "p99_itl_ms", "mean_tpot_ms")}
_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


class TuneError(ValueError):
    """A grid, workload or metric the tuner cannot use; the message names the field."""


def _kind(knob: str) -> type:
    """The knob's scalar type from its ServeFlags annotation (bool is tested first: it is an int too)."""
    ann = ServeFlags.model_fields[knob].annotation
    args = set(get_args(ann)) or {ann}
    return next(t for t in (bool, int, float) if t in args)


def _yaml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


def _check_value(knob: str, raw: object, where: str) -> Value:
    """One value through ServeFlags' own field validation; the message quotes pydantic's reason."""
    try:
        model = ServeFlags.model_validate({knob: raw})
    except ValidationError as e:
        err = e.errors()[0]
        raise TuneError(f"{where} {knob}: {raw!r}: {err['msg'].removeprefix('Value error, ')}") from None
    value = getattr(model, knob)
    assert isinstance(value, int | float)
    return value


def _convert(knob: str, text: str) -> object:
    kind, s = _kind(knob), text.strip()
    if kind is bool:
        if s.lower() in _TRUE + _FALSE:
            return s.lower() in _TRUE
        raise TuneError(f"--grid {knob}: {text!r} is not a boolean (true/false, on/off, yes/no)")
    try:
        return int(s) if kind is int else float(s)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise TuneError(f"--grid {knob}: {text!r} is not {noun}") from None


def knob_name(given: str) -> str:
    """A knob as the inventory spells it (snake_case); kebab-case and a leading -- are accepted."""
    name = given.strip().removeprefix("--").replace("-", "_")
    if name in KNOBS:
        return name
    if name in ServeFlags.model_fields:
        raise TuneError(f"--grid {name}: not a tunable knob (tunable: {', '.join(KNOBS)})")
    raise TuneError(f"--grid {name!r}: not a tunable knob{did_you_mean(name, KNOBS)} "
                    f"(tunable: {', '.join(KNOBS)})")


def parse_grid(items: Sequence[str], platform: str | None = None) -> dict[str, list[Value]]:
    """`--grid KNOB=V1,V2,...` options into knob -> values, in KNOBS order; each value is one a ServeFlags
    field accepts. platform ('cuda' / 'cpu'), when given, refuses a knob vLLM ignores there."""
    grid: dict[str, list[Value]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise TuneError(f"--grid {item!r}: expected KNOB=V1,V2,... (e.g. max_num_seqs=16,64)")
        knob = knob_name(key)
        if knob in grid:
            raise TuneError(f"--grid {knob}: given twice; list all its values in one --grid")
        if platform is not None and platform not in flag_meta(knob)["platforms"]:
            raise TuneError(f"--grid {knob}: has no effect on {platform} hosts")
        out: list[Value] = []
        for text in values.split(","):
            if not text.strip():
                raise TuneError(f"--grid {knob}: an empty value in {values!r}")
            value = _check_value(knob, _convert(knob, text), "--grid")
            if value not in out:
                out.append(value)
        grid[knob] = out
    if not grid:
        raise TuneError("--grid: no knob given; e.g. --grid max_num_batched_tokens=512,1024,2048 "
                        f"(tunable: {', '.join(KNOBS)})")
    total = math.prod(len(v) for v in grid.values())
    if total > MAX_POINTS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in grid.items())
        raise TuneError(f"--grid: {sizes} = {total} points; at most {MAX_POINTS} (each is a server start "
                        "and a benchmark run): drop some values")
    return {k: grid[k] for k in KNOBS if k in grid}


def current_values(rendered: Mapping[str, object]) -> dict[str, Value]:
    """The knobs' values in an instance's rendered flags (flags.render_flags: kebab-case, "off" written
    as a key of its own, flags.field_of), as the inventory spells them. A knob absent here runs at
    vLLM's default."""
    out: dict[str, Value] = {}
    for key, given in rendered.items():
        name, value = field_of(key, given)
        if name in KNOBS and isinstance(value, int | float):
            out[name] = value
    return {k: out[k] for k in KNOBS if k in out}


@dataclass(frozen=True)
class Workload:
    """The requests every point is measured with: `vllm bench serve`'s random dataset, seed 0."""

    input_len: int = 32
    output_len: int = 16
    num_prompts: int = 32
    request_rate: float | None = None  # requests/s; None: all at once (vLLM's inf)
    max_concurrency: int | None = None  # None: no client-side cap

    def __post_init__(self) -> None:
        for name in ("input_len", "output_len", "num_prompts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TuneError(f"workload {name}: {v!r} is not a positive integer")
        rate = self.request_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                                 or not rate > 0 or math.isnan(rate)):
            raise TuneError(f"workload request_rate: {rate!r} is not a positive number of requests/s")
        mc = self.max_concurrency
        if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int) or mc < 1):
            raise TuneError(f"workload max_concurrency: {mc!r} is not a positive integer")

    @property
    def label(self) -> str:
        rate = "all at once" if self.request_rate is None else f"{self.request_rate:g} req/s"
        conc = "" if self.max_concurrency is None else f", at most {self.max_concurrency} in flight"
        return (f"random {self.input_len} in / {self.output_len} out tokens, {self.num_prompts} prompts, "
                f"{rate}{conc}")


def workload_args(w: Workload) -> list[str]:
    """The dataset and pacing part of `vllm bench serve`'s arguments (the server part is the runner's)."""
    rate = "inf" if w.request_rate is None or math.isinf(w.request_rate) else f"{w.request_rate:g}"
    out = [*dataset_args(w.input_len, w.output_len, w.num_prompts), "--request-rate", rate]
    return out + ([] if w.max_concurrency is None else ["--max-concurrency", str(w.max_concurrency)])


@dataclass(frozen=True)
class TunePoint:
    """One setting of the knobs: overrides on the command line after the instance's --config."""

    values: tuple[tuple[str, Value], ...]
    is_baseline: bool = False
    # knobs the baseline leaves at vLLM's own default: no override, named in the label
    defaults: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Value]:
        return dict(self.values)

    def flags(self, vllm_version: str) -> list[str]:
        """`--max-num-seqs 16`, `--no-enforce-eager`, `--disable-prefix-caching` (0.33 on) ...: rendered
        as flags.render_flags renders them for that release."""
        rendered: dict[str, Scalar | list[Scalar]] = {}
        for name, value in self.values:
            put_flag(rendered, name.replace("_", "-"), value, flag_meta(name)["negatable"], vllm_version)
        return [a for k, v in rendered.items() for a in ([f"--{k}"] if v is True else [f"--{k}", str(v)])]

    @property
    def label(self) -> str:
        given = dict(self.values)
        parts = [f"{k}={_yaml(given[k])}" if k in given else f"{k}=(vLLM default)"
                 for k in KNOBS if k in given or k in self.defaults]
        return " ".join(parts) or "(vLLM defaults)"


def _point(values: Mapping[str, Value], baseline: bool = False, defaults: Sequence[str] = ()) -> TunePoint:
    return TunePoint(tuple((k, values[k]) for k in KNOBS if k in values), baseline,
                     tuple(k for k in KNOBS if k in defaults))


def refusal(values: Mapping[str, Value]) -> str:
    """Why vLLM would not start with these knob values, or "" (vLLM 0.32's SchedulerConfig checks):
    a batch budget below max_model_len needs chunked prefill (ServeFlags' own rule; unset chunked prefill
    is vLLM's default, on), and below max_num_seqs it is refused outright. A knob missing from `values`
    is vLLM's default, which vLLM sizes to pass these checks, so it is not checked."""
    why = []
    try:
        ServeFlags.model_validate(dict(values))
    except ValidationError as e:
        why += [str(err["msg"]).removeprefix("Value error, ") for err in e.errors()]
    budget, seqs = values.get("max_num_batched_tokens"), values.get("max_num_seqs")
    if budget is not None and seqs is not None and budget < seqs:
        why.append(f"max_num_batched_tokens ({budget}) is below max_num_seqs ({seqs}): vLLM refuses it "
                   "(each running sequence needs a token of the step's budget)")
    return "; ".join(why)


def points(grid: Mapping[str, Sequence[Value]], current: Mapping[str, Value]
           ) -> tuple[list[TunePoint], list[tuple[str, str]]]:
    """The baseline (the instance's current values of the grid's knobs) first, then every combination of
    the grid but the baseline's own; combinations vLLM would refuse come back as (label, why) instead.

    `current` holds the instance's effective knob values (current_values()); keys that are not knobs are
    ignored. Each point is checked together with the current values of the knobs it does not set (the
    trial server inherits them from the instance's config): max_model_len comes from there when the grid
    does not vary it."""
    base = {k: v for k, v in current.items() if k in KNOBS}
    knobs = [k for k in KNOBS if k in grid]
    baseline = _point({k: base[k] for k in knobs if k in base}, True, [k for k in knobs if k not in base])
    out, skipped = [baseline], []
    for combo in itertools.product(*(grid[k] for k in knobs)):
        p = _point(dict(zip(knobs, combo, strict=True)))
        if not baseline.defaults and p.values == baseline.values:
            continue
        why = refusal({**base, **p.as_dict()})
        if why:
            skipped.append((p.label, why))
        else:
            out.append(p)
    return out, skipped


@dataclass(frozen=True)
class Outcome:
    point: TunePoint
    result: BenchResult | None
    error: str = ""  # why there is no result: the server died, timed out, the report was missing

    @property
    def usable(self) -> bool:
        return self.result is not None and self.result.ok


def _metric(latency: str) -> str:
    if latency not in LATENCY_METRICS:
        raise TuneError(f"--latency {latency!r}: not a latency metric"
                        f"{did_you_mean(latency, LATENCY_METRICS)} (known: {', '.join(LATENCY_METRICS)})")
    return LATENCY_METRICS[latency]


def _lat(o: Outcome, attr: str) -> float:
    assert o.result is not None
    return float(getattr(o.result, attr))


def _thr(o: Outcome) -> float:
    assert o.result is not None
    return o.result.output_throughput


def pareto(outcomes: Sequence[Outcome], latency: str) -> list[Outcome]:
    """The usable outcomes no other beats on both counts (more output tok/s and less latency, one of them
    strictly), by rising latency: the choices worth weighing. Equal outcomes are all kept."""
    attr = _metric(latency)
    usable = [o for o in outcomes if o.usable]
    front = [o for o in usable
             if not any(_thr(p) >= _thr(o) and _lat(p, attr) <= _lat(o, attr)
                        and (_thr(p) > _thr(o) or _lat(p, attr) < _lat(o, attr)) for p in usable)]
    return sorted(front, key=lambda o: (_lat(o, attr), -_thr(o)))


@dataclass(frozen=True)
class Recommendation:
    chosen: Outcome
    baseline: Outcome | None  # the inventory's values as measured; None when not run
    latency: str
    target_ms: float | None

    @property
    def keep(self) -> bool:
        return self.chosen.point.is_baseline

    @property
    def gain(self) -> float | None:
        """Output throughput over the baseline's, as a fraction (0.12 = 12 % more); None without one."""
        if self.baseline is None or not self.baseline.usable or _thr(self.baseline) <= 0:
            return None
        return _thr(self.chosen) / _thr(self.baseline) - 1

    @property
    def latency_change_ms(self) -> float | None:
        if self.baseline is None or not self.baseline.usable:
            return None
        return _lat(self.chosen, _metric(self.latency)) - _lat(self.baseline, _metric(self.latency))

    @property
    def text(self) -> str:
        lat = _lat(self.chosen, _metric(self.latency))
        measured = f"{_thr(self.chosen):.1f} out tok/s, {self.latency} {lat:.1f} ms"
        if self.keep:
            return f"keep the inventory's values ({self.chosen.point.label}): {measured}"
        gain, delta = self.gain, self.latency_change_ms
        if gain is None or delta is None:
            vs = "; the inventory's values gave no usable result to compare with"
        else:
            vs = (f" ({gain:+.1%} output throughput, {delta:+.1f} ms {self.latency} "
                  "over the inventory's values)")
        return f"{self.chosen.point.label}: {measured}{vs}"


def recommend(outcomes: Sequence[Outcome], latency: str, target_ms: float | None) -> Recommendation | None:
    """The most output throughput among usable outcomes within the target (all, without one); a tie goes
    to the lower latency, then to the baseline: a change must earn its restart. None when none qualifies."""
    attr = _metric(latency)
    within = [o for o in outcomes if o.usable and (target_ms is None or _lat(o, attr) <= target_ms)]
    if not within:
        return None
    best = max(within, key=lambda o: (_thr(o), -_lat(o, attr), o.point.is_baseline))
    baseline = next((o for o in outcomes if o.point.is_baseline), None)
    return Recommendation(best, baseline, latency, target_ms)


def inventory_diff(host: str, instance: str, current: Mapping[str, Value], chosen: TunePoint) -> str:
    """What to change in the instance's `flags:` block, as a unified diff of its effective knob values
    (the inventory over the project's defaults); "" when nothing changes. Only read: the operator edits."""
    before = dict(current)
    after = {**before, **chosen.as_dict()}
    if after == before:
        return ""

    def block(values: Mapping[str, object]) -> list[str]:
        return ["flags:\n", *(f"  {k}: {_yaml(values[k])}\n" for k in sorted(values))]

    return "".join(difflib.unified_diff(block(before), block(after), f"inventory: {host}/{instance} (now)",
                                        f"inventory: {host}/{instance} (recommended)"))


def progress_line(i: int, n: int, outcome: Outcome, latency: str) -> str:
    head = f"tune {i}/{n} {outcome.point.label}"
    r = outcome.result
    if r is None:
        return f"{head}: failed: {outcome.error or 'no result'}"
    status = "ok" if r.ok else "FAILED"
    lat = _lat(outcome, _metric(latency))
    return (f"{head}: {r.output_throughput:.1f} out tok/s, {latency} {lat:.1f} ms, "
            f"{r.successful}/{r.failed} {status}" + (f" ({outcome.error})" if outcome.error else ""))


HEAD = ("POINT", "OK/FAIL", "REQ/S", "OUT TOK/S", "TTFT P99", "ITL MEAN", "NOTE")


def _notes(o: Outcome, front: Sequence[Outcome], rec: Recommendation | None) -> str:
    marks = [m for m, on in (("baseline", o.point.is_baseline), ("pareto", o in front),
                             ("recommended", rec is not None and rec.chosen == o)) if on]
    if o.result is None:
        marks.append(o.error or "no result")
    elif not o.result.ok:
        marks.append("requests failed")
    return ", ".join(marks)


def _rows(outcomes: Sequence[Outcome], latency: str, rec: Recommendation | None) -> list[tuple[str, ...]]:
    front = pareto(outcomes, latency)
    rows: list[tuple[str, ...]] = []
    for o in outcomes:
        r, note = o.result, _notes(o, front, rec)
        if r is None:
            rows.append((o.point.label, "-", "-", "-", "-", "-", note))
        else:
            rows.append((o.point.label, f"{r.successful}/{r.failed}", f"{r.request_throughput:.2f}",
                         f"{r.output_throughput:.1f}", f"{r.p99_ttft_ms:.1f} ms", f"{r.mean_itl_ms:.2f} ms",
                         note))
    return rows


def table(outcomes: Sequence[Outcome], latency: str, recommendation: Recommendation | None = None) -> str:
    return columns(HEAD, _rows(outcomes, latency, recommendation))


def _result_dict(r: BenchResult | None) -> dict[str, float | int] | None:
    return None if r is None else {f.name: getattr(r, f.name) for f in fields(r) if f.name != "raw"}


def summary(host: str, instance: str, model: str, release: str, workload: Workload, latency: str,
            target_ms: float | None, outcomes: Sequence[Outcome], recommendation: Recommendation | None,
            skipped: Sequence[tuple[str, str]] = (), wall_s: float | None = None) -> dict[str, object]:
    """The report's facts for machines (JSON-ready)."""
    front = pareto(outcomes, latency)
    rec = recommendation
    return {
        "host": host, "instance": instance, "model": model, "release": release,
        "workload": asdict(workload), "latency": latency, "target_ms": target_ms, "wall_s": wall_s,
        "points": [{"label": o.point.label, "values": o.point.as_dict(), "baseline": o.point.is_baseline,
                    "usable": o.usable, "pareto": o in front, "error": o.error,
                    "result": _result_dict(o.result)}
                   for o in outcomes],
        "skipped": [{"label": label, "why": why} for label, why in skipped],
        "recommendation": None if rec is None else {
            "label": rec.chosen.point.label, "values": rec.chosen.point.as_dict(), "keep": rec.keep,
            "output_throughput": _thr(rec.chosen), "latency_ms": _lat(rec.chosen, _metric(latency)),
            "gain": rec.gain, "latency_change_ms": rec.latency_change_ms},
    }


_CSS = """
body { font-family: sans-serif; margin: 24px; color: #111; max-width: 1100px; }
h1 { font-size: 20px; margin: 0 0 6px; }
p.summary { color: #444; margin: 0 0 14px; }
#recommendation { border-left: 4px solid #555; padding: 6px 12px; margin: 14px 0; background: #f4f4f4; }
pre#diff { background: #f6f6f6; padding: 8px; font-size: 12px; }
table#trials { border-collapse: collapse; font-size: 12px; }
table#trials th, table#trials td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; }
tr.recommended td { font-weight: bold; }
"""


def report_html(host: str, instance: str, model: str, release: str, workload: Workload, latency: str,
                target_ms: float | None, outcomes: Sequence[Outcome], recommendation: Recommendation | None,
                diff: str, started: str, wall_s: float, hardware_note: str = "",
                skipped: Sequence[tuple[str, str]] = ()) -> str:
    """One page, no scripts or outside resources (a headless browser screenshots it offline)."""
    attr = _metric(latency)
    front = pareto(outcomes, latency)
    rec = recommendation
    pts = []
    for o in outcomes:
        kind = ("recommended" if rec is not None and rec.chosen == o else "baseline" if o.point.is_baseline
                else "point") if o.usable else "failed"
        x, y = (_lat(o, attr), _thr(o)) if o.usable else (math.nan, math.nan)
        pts.append(svgplot.Point(x, y, o.point.label, kind))
    chart = svgplot.scatter(f"{host}/{instance}: output throughput against {latency}", pts,
                            [(_lat(o, attr), _thr(o)) for o in front], f"{latency} (ms)", "output tok/s",
                            target_x=target_ms)
    usable = sum(o.usable for o in outcomes)
    facts = [f"model {model}", f"release {release}", f"workload: {workload.label}",
             f"{len(outcomes)} points ({usable} usable)", f"started {started}", f"wall time {wall_s:.0f} s"]
    if hardware_note:
        facts.append(hardware_note)
    target = "no latency target" if target_ms is None else f"target {latency} ≤ {target_ms:g} ms"
    if rec is None:
        verdict = (f"no point meets the target ({target})" if usable else "no point gave a usable result")
        rec_html = f"<p><strong>{escape(verdict)}</strong>; the inventory's values stay.</p>"
    else:
        head = "Keep the inventory's values" if rec.keep else "Recommended"
        rec_html = (f"<p><strong>{escape(head)}:</strong> {escape(rec.chosen.point.label)}</p>"
                    f"<p>{escape(rec.text)} ({escape(target)})</p>")
    rows = _rows(outcomes, latency, rec)
    trs = []
    for o, row in zip(outcomes, rows, strict=True):
        cls = " class=\"recommended\"" if rec is not None and rec.chosen == o else ""
        trs.append(f"<tr{cls}>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
    title = f"vLLM tune: {host}/{instance}"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="summary">{escape(" · ".join(facts))}</p>',
        f'<div id="chart">{chart}</div>',
        f'<section id="recommendation"><h2>Recommendation</h2>{rec_html}</section>',
        "<h2>Inventory change</h2>",
        f'<pre id="diff">{escape(diff) if diff else "(no change)"}</pre>',
        "<h2>Trials</h2>",
        '<table id="trials"><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in HEAD) + "</tr></thead>",
        "<tbody>", *trs, "</tbody></table>",
        *(['<h2>Not run</h2><ul id="skipped">'
           + "".join(f"<li>{escape(label)}: {escape(why)}</li>" for label, why in skipped) + "</ul>"]
          if skipped else []),
        "</body></html>",
    ])
