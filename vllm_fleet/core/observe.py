"""Grafana dashboard and Prometheus rules for a fleet (`vllm-fleet dashboards`). Pure: the only I/O is
reading the packaged table ``vllm_fleet/data/metrics.toml``.

Why generated, not shipped as a fixed file: vLLM renames metrics between releases
(``vllm:gpu_cache_usage_perc`` became ``vllm:kv_cache_usage_perc``), and a dashboard written for one
release shows empty panels on the next. Every signal here lists the names it has had, newest first; the
names used are the ones the fleet's releases register (read from their wheels by
scripts/release_metrics.py), joined with ``or`` where the fleet spans a rename. A release that registers
none of a signal's names is refused with the signal and the panel or rule that needs it.

Labels are the targets file's (vllm_fleet/core/prometheus.py): ``host``, ``instance``, ``model``,
``release``, and Prometheus' ``job`` for the scrape job the operator gives that file.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from vllm_fleet.core import lb
from vllm_fleet.core.flags import release_of, version_tuple

DASHBOARD_FILE = "vllm-fleet-dashboard.json"
RULES_FILE = "vllm-fleet-rules.yml"
DEFAULT_JOB = "vllm"
# Grafana's own step-aware window; the rules and the lab's checks use fixed windows instead
RATE = "$__rate_interval"


class ObserveError(ValueError):
    """A release without metric facts, or one that lacks every name of a signal a panel or rule uses."""


@dataclass(frozen=True)
class Metric:
    kind: str  # counter | gauge | histogram
    condition: str = ""  # "" when always registered


@cache
def release_metrics() -> dict[str, dict[str, Metric]]:
    """release -> metric name -> Metric, as the wheels register them."""
    text = resources.files("vllm_fleet.data").joinpath("metrics.toml").read_text()
    table = tomllib.loads(text)["release"]
    return {release: {name: Metric(m["kind"], m.get("condition", "")) for name, m in r["metric"].items()}
            for release, r in table.items()}


@dataclass(frozen=True)
class Signal:
    """What a panel or rule measures, under every name vLLM has given it (newest first)."""

    names: tuple[str, ...]
    kind: str


SIGNALS: dict[str, Signal] = {
    "running": Signal(("vllm:num_requests_running",), "gauge"),
    "waiting": Signal(("vllm:num_requests_waiting",), "gauge"),
    "kv_cache": Signal(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "gauge"),
    "prefix_hits": Signal(("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), "counter"),
    "prefix_queries": Signal(("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"), "counter"),
    "preemptions": Signal(("vllm:num_preemptions",), "counter"),
    "prompt_tokens": Signal(("vllm:prompt_tokens",), "counter"),
    "generation_tokens": Signal(("vllm:generation_tokens",), "counter"),
    "ttft": Signal(("vllm:time_to_first_token_seconds",), "histogram"),
    "itl": Signal(("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), "histogram"),
    "e2e": Signal(("vllm:e2e_request_latency_seconds",), "histogram"),
    "http": Signal(("http_requests_total",), "counter"),
}


def series_name(name: str, kind: str, suffix: str = "") -> str:
    """The exposed series: prometheus_client adds `_total` to a counter (once), a histogram is read
    through `_bucket` (or `_sum`, `_count`)."""
    if kind == "counter":
        return name if name.endswith("_total") else f"{name}_total"
    return name + (suffix or ("_bucket" if kind == "histogram" else ""))


@dataclass(frozen=True)
class Fleet:
    """What the generated files are specific to: the releases the fleet runs or is being moved to, its
    served models, the hosts with a front door, and Prometheus' job for the targets file."""

    releases: tuple[str, ...]
    models: tuple[str, ...]
    doors: tuple[str, ...] = ()
    job: str = DEFAULT_JOB
    ttft_p99_target_s: float = 2.0
    down_for: str = "1m"
    facts: Mapping[str, Mapping[str, Metric]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # both are written into PromQL and YAML: a quote or a brace would change what the rules select
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]{0,99}", self.job):
            raise ObserveError(f"--job {self.job!r}: letters, digits, '_', '.', ':' and '-' only")
        if not re.fullmatch(r"(\d+(ms|[smhdwy]))+", self.down_for):
            raise ObserveError(f"--down-for {self.down_for!r}: a Prometheus duration such as 90s or 5m")
        if not self.ttft_p99_target_s > 0:
            raise ObserveError(f"--ttft-p99-target {self.ttft_p99_target_s!r}: a positive number of seconds")

    def metrics(self) -> Mapping[str, Mapping[str, Metric]]:
        return self.facts if self.facts is not None else release_metrics()


def names_for(fleet: Fleet, key: str, user: str) -> tuple[str, ...]:
    """The names of signal `key` the fleet's releases register, each release's newest one."""
    signal, facts = SIGNALS[key], fleet.metrics()
    used: list[str] = []
    for release in fleet.releases:
        # a post or local release (0.34.0.post1, 0.34.0+cu129) registers what its base release does
        have = facts.get(release) or facts.get(release_of(release))
        if have is None:
            known = ", ".join(sorted(facts, key=version_tuple))
            raise ObserveError(f"no metric facts for vLLM {release}: this vllm-fleet does not know "
                               f"its metric names (known: {known}); a newer vllm-fleet adds them, read "
                               "from the release's wheel")
        name = next((n for n in signal.names if n in have and not have[n].condition), None)
        if name is None:
            raise ObserveError(f"{user}: vLLM {release} registers none of {', '.join(signal.names)} "
                               f"(signal {key!r})")
        if have[name].kind != signal.kind:
            raise ObserveError(f"{user}: {name} is a {have[name].kind} in vLLM {release}, "
                               f"not a {signal.kind}")
        if name not in used:
            used.append(name)
    return tuple(used)


class Exprs:
    """PromQL for one selector: `one(key, template)` writes `template` once per name the fleet needs
    and joins them with `or`, since a range selector cannot span two metric names."""

    def __init__(self, fleet: Fleet, selector: str, user: str = "") -> None:
        self.fleet, self.selector, self.user = fleet, selector, user

    def one(self, key: str, template: str = "{s}", suffix: str = "", extra: str = "") -> str:
        kind = SIGNALS[key].kind
        sel = self.selector if not extra else self.selector[:-1] + "," + extra + "}"
        parts = [template.format(s=series_name(n, kind, suffix) + sel)
                 for n in names_for(self.fleet, key, self.user)]
        return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


_RE2_META = re.compile(r"([.^$*+?()\[\]{}|\\])")


def _alternation(values: Iterable[str]) -> str:
    """An RE2 alternation of literal names, as a PromQL raw (backtick) string: a model name such as
    `org/Model-3.1` needs its dot escaped, and a raw string keeps the backslash from being read twice."""
    return "`" + "|".join(_RE2_META.sub(r"\\\1", v) for v in sorted(set(values))) + "`"


def rule_selector(fleet: Fleet) -> str:
    return f'{{job="{fleet.job}",model=~{_alternation(fleet.models)}}}'


DASH_SELECTOR = '{job=~"$job",model=~"$model",host=~"$host",instance=~"$instance"}'
BY = "job, model, host, instance"


# -- panels ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]  # (legend, expr)
    door: bool = False


def _quantiles(e: Exprs, key: str, by: str = "model") -> tuple[tuple[str, str], ...]:
    inner = e.one(key, f"rate({{s}}[{RATE}])")
    return tuple((f"p{int(q * 100)} {{{{{by}}}}}",
                  f"histogram_quantile({q}, sum by (le, {by}) ({inner}))") for q in (0.5, 0.99))


def panels(fleet: Fleet) -> list[Panel]:
    """Requests, latency, throughput, cache, preemptions, errors and restarts per instance; the door's
    tenants when the fleet has a door."""
    inst = "{{host}}/{{instance}}"
    rate = f"rate({{s}}[{RATE}])"

    def per_instance(title: str, key: str, template: str = "{s}", agg: str = "sum") -> str:
        return f"{agg} by ({BY}) ({Exprs(fleet, DASH_SELECTOR, f'panel {title!r}').one(key, template)})"

    def exprs(title: str) -> Exprs:
        return Exprs(fleet, DASH_SELECTOR, f"panel {title!r}")

    out = [
        Panel("Requests running", "short", ((inst, per_instance("Requests running", "running")),)),
        Panel("Requests waiting", "short", ((inst, per_instance("Requests waiting", "waiting")),)),
        Panel("Time to first token", "s", _quantiles(exprs("Time to first token"), "ttft")),
        Panel("Inter-token latency", "s", _quantiles(exprs("Inter-token latency"), "itl")),
        Panel("Tokens per second", "short", (
            (f"generated {inst}", per_instance("Tokens per second", "generation_tokens", rate)),
            (f"prompt {inst}", per_instance("Tokens per second", "prompt_tokens", rate)))),
        Panel("KV cache use", "percentunit", ((inst, per_instance("KV cache use", "kv_cache", agg="max")),)),
        Panel("Prefix cache hit rate", "percentunit", ((inst, _hit_ratio(exprs("Prefix cache hit rate"),
                                                                          RATE)),)),
        Panel("Preemptions per second", "short", ((inst, per_instance("Preemptions", "preemptions", rate)),)),
        Panel("HTTP 5xx ratio", "percentunit", ((inst, _error_ratio(exprs("HTTP 5xx ratio"), RATE)),)),
        Panel("Restarts (watchdog or other)", "short", (
            (inst, f"changes(process_start_time_seconds{DASH_SELECTOR}[1h])"),)),
    ]
    if fleet.doors:
        tenants = '{job=~"$job",instance="door",endpoint="tenants"}'
        m = lb.TENANT_METRICS
        up = 'haproxy_server_status{job=~"$job",instance="door",endpoint="haproxy",state="UP"}'
        out += [
            Panel("Door: requests per tenant", "reqps", (
                ("{{tenant}} {{code}}", f"sum by (tenant, code) (rate({m['requests']}{tenants}[{RATE}]))"),),
                door=True),
            Panel("Door: tokens per tenant", "short", (
                ("{{tenant}} {{kind}}", f"sum by (tenant, kind) (rate({m['tokens']}{tenants}[{RATE}]))"),),
                door=True),
            Panel("Door: tokens in the last minute", "short", (
                ("{{tenant}}", f"sum by (tenant) ({m['window']}{tenants})"),
                ("{{tenant}} limit", f"sum by (tenant) ({m['limit']}{tenants})")), door=True),
            Panel("Door: instances up per listener", "short", (("{{proxy}}", f"sum by (proxy) ({up})"),),
                  door=True),
        ]
    return out


def _hit_ratio(e: Exprs, window: str) -> str:
    hits = f"sum by ({BY}) ({e.one('prefix_hits', f'rate({{s}}[{window}])')})"
    queries = f"sum by ({BY}) ({e.one('prefix_queries', f'rate({{s}}[{window}])')})"
    return f"{hits} / ({queries} > 0)"


def _error_ratio(e: Exprs, window: str) -> str:
    """5xx answers over all answers; a healthy instance has no 5xx series at all, so the ratio falls
    back to 0 for every instance that answered anything (an empty panel would look like no data)."""
    rate = f"rate({{s}}[{window}])"
    total = f"sum by ({BY}) ({e.one('http', rate)})"
    errors = "sum by ({}) ({})".format(BY, e.one("http", rate, extra='status=~"5.."'))
    return f"({errors} / ({total} > 0)) or ({total} * 0)"


# -- rules -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Alert:
    name: str
    signal: str  # what is compared: evaluated on its own, it must return series on a live fleet
    op: str
    threshold: str
    for_: str
    severity: str
    summary: str

    @property
    def expr(self) -> str:
        return f"{self.signal} {self.op} {self.threshold}"


RECORD_PREFIX = "vllm_fleet:"


def recording_rules(fleet: Fleet) -> list[tuple[str, str]]:
    """Series the alerts and a long-range dashboard read cheaply: 5 m windows, per instance."""
    e = Exprs(fleet, rule_selector(fleet), "recording rules")
    by_model = f"histogram_quantile(0.99, sum by (le, job, model) ({e.one('ttft', 'rate({s}[5m])')}))"
    return [
        (f"{RECORD_PREFIX}ttft_seconds:p99_5m", by_model),
        (f"{RECORD_PREFIX}itl_seconds:p99_5m",
         f"histogram_quantile(0.99, sum by (le, job, model) ({e.one('itl', 'rate({s}[5m])')}))"),
        (f"{RECORD_PREFIX}generation_tokens:rate5m",
         f"sum by ({BY}) ({e.one('generation_tokens', 'rate({s}[5m])')})"),
        (f"{RECORD_PREFIX}http_5xx:ratio_rate5m", _error_ratio(e, "5m")),
        (f"{RECORD_PREFIX}prefix_cache_hits:ratio_rate5m", _hit_ratio(e, "5m")),
    ]


def alerts(fleet: Fleet) -> list[Alert]:
    sel = rule_selector(fleet)
    e = Exprs(fleet, sel, "alert rules")
    up_sel = rule_selector(fleet)
    return [
        Alert("VllmInstanceDown", f"up{up_sel}", "==", "0", fleet.down_for, "critical",
              "{{ $labels.host }}/{{ $labels.instance }} ({{ $labels.model }}) cannot be scraped"),
        Alert("VllmInstanceRestarted", f"changes(process_start_time_seconds{sel}[15m])", ">", "0", "0s",
              "warning", "{{ $labels.host }}/{{ $labels.instance }} restarted in the last 15 minutes "
                         "(the watchdog restarts a hung engine; so does a deploy)"),
        Alert("VllmKvCacheSaturated", f"max by ({BY}) ({e.one('kv_cache')})", ">", "0.95", "5m", "warning",
              "{{ $labels.host }}/{{ $labels.instance }} KV cache over 95% for 5 minutes: requests queue "
              "or are preempted"),
        Alert("VllmQueueGrowing", f"sum by ({BY}) ({e.one('waiting', 'deriv({s}[10m])')})", ">", "0", "10m",
              "warning", "{{ $labels.host }}/{{ $labels.instance }}: waiting requests grew for 10 minutes"),
        Alert("VllmErrorRate", f"{RECORD_PREFIX}http_5xx:ratio_rate5m", ">", "0.05", "5m", "critical",
              "{{ $labels.host }}/{{ $labels.instance }}: over 5% of answers are 5xx"),
        Alert("VllmTtftP99High", f"{RECORD_PREFIX}ttft_seconds:p99_5m", ">", f"{fleet.ttft_p99_target_s:g}",
              "10m", "warning",
              f"{{{{ $labels.model }}}}: TTFT p99 over {fleet.ttft_p99_target_s:g} s for 10 minutes"),
    ]


def rules_yaml(fleet: Fleet) -> str:
    groups = [
        {"name": "vllm-fleet-records",
         "rules": [{"record": r, "expr": x} for r, x in recording_rules(fleet)]},
        {"name": "vllm-fleet-alerts", "rules": [
            {"alert": a.name, "expr": a.expr, "for": a.for_, "labels": {"severity": a.severity},
             "annotations": {"summary": a.summary}} for a in alerts(fleet)]},
    ]
    head = (f"# Generated by `vllm-fleet dashboards` for job {fleet.job!r}, vLLM "
            f"{', '.join(fleet.releases)}; regenerate after a release change.\n")
    return head + yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000)


# -- the dashboard -----------------------------------------------------------------------------------

def _variable(name: str, query: str, label: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": {"type": "prometheus",
            "uid": "${datasource}"}, "query": {"query": query, "refId": name}, "definition": query,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1}


def dashboard(fleet: Fleet) -> dict[str, Any]:
    """Grafana's JSON model, provisioning-ready: the datasource is a variable, no `__inputs`."""
    probe = series_name(names_for(fleet, "running", "dashboard variables")[0], "gauge")
    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "refresh": 1},
        {**_variable("job", f"label_values({probe}, job)", "Job"), "includeAll": False, "multi": False,
         "current": {"text": fleet.job, "value": fleet.job}},
        _variable("model", f'label_values({probe}{{job=~"$job"}}, model)', "Model"),
        _variable("host", f'label_values({probe}{{job=~"$job",model=~"$model"}}, host)', "Host"),
        _variable("instance", f'label_values({probe}{{job=~"$job",model=~"$model",host=~"$host"}}, instance)',
                  "Instance"),
    ]
    out = []
    for i, p in enumerate(panels(fleet)):
        out.append({
            "id": i + 1, "type": "timeseries", "title": p.title,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(ord("A") + j), "expr": x, "legendFormat": legend}
                        for j, (legend, x) in enumerate(p.targets)],
        })
    return {"title": f"vLLM fleet ({fleet.job})", "uid": f"vllm-fleet-{_slug(fleet.job)}",
            "tags": ["vllm", "vllm-fleet"], "timezone": "utc", "schemaVersion": 39, "version": 1,
            "editable": True, "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
            "description": f"Generated by vllm-fleet for vLLM {', '.join(fleet.releases)}",
            "templating": {"list": variables}, "panels": out}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:30] or "fleet"


def dashboard_json(fleet: Fleet) -> str:
    return json.dumps(dashboard(fleet), indent=2) + "\n"


def concrete(expr: str, window: str = "1m") -> str:
    """A dashboard expression with Grafana's variables filled for every value: what the lab evaluates
    against a real Prometheus, and what the preview draws."""
    for var in ("job", "model", "host", "instance"):
        expr = expr.replace(f'=~"${var}"', '=~".+"')
    return expr.replace(RATE, window)


def used_names(fleet: Fleet) -> set[str]:
    """Every vLLM metric name the fleet's panels and rules read (for the release-coverage test)."""
    text = dashboard_json(fleet) + rules_yaml(fleet)
    names = set()
    for signal in SIGNALS.values():
        for n in signal.names:
            if series_name(n, signal.kind) in text or n in text:
                names.add(n)
    return names


def summary(fleet: Fleet, paths: Sequence[str]) -> str:
    return (f"dashboards: {len(panels(fleet))} panels, {len(recording_rules(fleet))} recording and "
            f"{len(alerts(fleet))} alert rules for vLLM {', '.join(fleet.releases)} "
            f"(models {', '.join(fleet.models)}) written to {', '.join(paths)}")
