"""The generated dashboard and rules: every name they read is registered by every release of the table
(names read from the wheels into vllm_fleet/data/metrics.toml), renames are bridged with `or`, a
release without a name is refused with the panel or rule, and Prometheus' own promtool accepts the
rules (promtool is Debian's, installed with prometheus by scripts/setup.sh)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from vllm_fleet.core import observe, variants
from vllm_fleet.core.observe import Fleet, Metric

TABLE_RELEASES = tuple(sorted(variants.load_table(), key=lambda v: tuple(int(p) for p in v.split("."))))


def fleet(**kw) -> Fleet:
    return Fleet(**{"releases": TABLE_RELEASES, "models": ("tiny-llama", "org/Model-3.1"), **kw})


def test_every_release_of_the_table_has_metric_facts():
    assert set(TABLE_RELEASES) <= set(observe.release_metrics()), (
        "scripts/release_metrics.py --pypi <release> --write for the missing ones")


@pytest.mark.parametrize("release", TABLE_RELEASES)
def test_every_name_a_panel_or_rule_reads_is_registered_by_each_release(release):
    f = fleet(releases=(release,), doors=("door1",))
    have = observe.release_metrics()[release]
    used = observe.used_names(f)
    assert used, "no vLLM metric found in the generated files"
    for name in used:
        assert name in have and not have[name].condition, f"vLLM {release} does not always register {name}"
    # and the generated text names exactly those (no name outside the signals table slipped in)
    text = observe.dashboard_json(f) + observe.rules_yaml(f)
    for name in set(re.findall(r"vllm:[a-z_]+", text)):
        base = name.removesuffix("_total").removesuffix("_bucket")
        assert base in have or name in have, f"{name} is not a metric of vLLM {release}"


def test_a_release_lacking_a_name_is_refused_naming_the_panel():
    facts = {r: dict(m) for r, m in observe.release_metrics().items()}
    facts["0.34.0"].pop("vllm:num_requests_waiting")
    with pytest.raises(observe.ObserveError, match=r"panel 'Requests waiting': vLLM 0\.34\.0 registers none "
                                                   r"of vllm:num_requests_waiting"):
        observe.dashboard(fleet(facts=facts))


def test_a_hidden_or_conditional_name_does_not_count():
    facts = {r: dict(m) for r, m in observe.release_metrics().items()}
    facts["0.33.0"]["vllm:kv_cache_usage_perc"] = Metric("gauge", "self.show_hidden_metrics")
    with pytest.raises(observe.ObserveError, match="vLLM 0.33.0 registers none of vllm:kv_cache_usage_perc"):
        observe.rules_yaml(fleet(facts=facts))


def test_a_release_without_facts_is_refused_naming_the_known_ones():
    with pytest.raises(observe.ObserveError, match=r"no metric facts for vLLM 0\.99\.0: .*\(known: 0\.20\.0, "
                                                   r"0\.31\.0, 0\.32\.0, 0\.33\.0, 0\.34\.0\)"):
        observe.dashboard(fleet(releases=("0.34.0", "0.99.0")))


def test_a_fleet_across_a_rename_reads_both_names_with_or():
    facts = {r: dict(m) for r, m in observe.release_metrics().items()}
    old = {n: m for n, m in facts["0.20.0"].items() if n != "vllm:kv_cache_usage_perc"}
    old["vllm:gpu_cache_usage_perc"] = Metric("gauge")
    facts["0.9.0"] = old
    f = fleet(releases=("0.9.0", "0.34.0"), facts=facts)
    kv = next(p for p in observe.panels(f) if p.title == "KV cache use")
    expr = kv.targets[0][1]
    assert "vllm:kv_cache_usage_perc{" in expr and "vllm:gpu_cache_usage_perc{" in expr and " or " in expr
    # one release alone: its own name only
    only_new = next(p for p in observe.panels(fleet(releases=("0.34.0",), facts=facts))
                    if p.title == "KV cache use")
    assert "gpu_cache_usage_perc" not in only_new.targets[0][1]


def test_counters_and_histograms_are_read_by_their_exposed_series():
    text = observe.dashboard_json(fleet())
    assert "vllm:generation_tokens_total{" in text and "vllm:time_to_first_token_seconds_bucket{" in text
    assert "vllm:num_preemptions_total{" in text and "http_requests_total_total" not in text
    assert "vllm:generation_tokens{" not in text


def test_the_rules_select_the_fleets_job_and_models_and_escape_them():
    rules = yaml.safe_load(observe.rules_yaml(fleet(job="prod-vllm")))
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    down = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "VllmInstanceDown")
    assert down["expr"] == 'up{job="prod-vllm",model=~`org/Model-3\\.1|tiny-llama`} == 0'
    assert down["for"] == "1m" and down["labels"]["severity"] == "critical"
    assert all('job="prod-vllm"' in x or x.startswith("vllm_fleet:") for x in exprs), exprs
    names = {r.get("alert") for g in rules["groups"] for r in g["rules"]} - {None}
    assert names == {"VllmInstanceDown", "VllmInstanceRestarted", "VllmKvCacheSaturated", "VllmQueueGrowing",
                     "VllmErrorRate", "VllmTtftP99High"}
    ttft = next(a for a in observe.alerts(fleet(ttft_p99_target_s=0.5)) if a.name == "VllmTtftP99High")
    assert ttft.expr == "vllm_fleet:ttft_seconds:p99_5m > 0.5"


def test_the_dashboard_is_provisioning_ready_with_the_fleet_variables():
    d = observe.dashboard(fleet(doors=("lab7",)))
    assert "__inputs" not in d and d["uid"] == "vllm-fleet-vllm"
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "job", "model", "host", "instance"]
    titles = [p["title"] for p in d["panels"]]
    for needed in ("Requests running", "Requests waiting", "Time to first token", "Inter-token latency",
                   "Tokens per second", "KV cache use", "Prefix cache hit rate", "Preemptions per second",
                   "HTTP 5xx ratio", "Restarts (watchdog or other)", "Door: requests per tenant",
                   "Door: tokens per tenant"):
        assert needed in titles
    for p in d["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"] and all(t["expr"] for t in p["targets"])
        if not p["title"].startswith("Door"):
            assert all('$model' in t["expr"] for t in p["targets"]), p
    # no door in the fleet: no door panels
    assert not [p for p in observe.dashboard(fleet())["panels"] if p["title"].startswith("Door")]
    # positions do not overlap
    cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in d["panels"]}
    assert len(cells) == len(d["panels"])
    json.dumps(d)


def test_concrete_fills_every_variable():
    for p in observe.panels(fleet(doors=("d",))):
        for _, expr in p.targets:
            assert "$" not in observe.concrete(expr), expr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs it")
def test_promtool_accepts_the_rules(tmp_path):
    path = tmp_path / observe.RULES_FILE
    path.write_text(observe.rules_yaml(fleet()))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 11 rules found" in out.stdout, out.stdout
    # and it rejects a broken one: the check is real
    path.write_text(observe.rules_yaml(fleet()).replace("== 0", "== ("))
    assert subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True).returncode != 0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/setup.sh installs it")
def test_promtool_unit_test_the_down_alert_fires_after_its_for(tmp_path):
    """promtool's rule unit test: a target that stops answering fires VllmInstanceDown once `for:` has
    passed, not before."""
    rules = tmp_path / observe.RULES_FILE
    rules.write_text(observe.rules_yaml(fleet(down_for="2m")))
    labels = 'job="vllm",model="tiny-llama",host="lab1",instance="default",release="0.32.0-cpu"'
    (tmp_path / "t.yml").write_text(yaml.safe_dump({
        "rule_files": [str(rules)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": f"up{{{labels}}}", "values": "1 1 0 0 0 0"}],
                   "alert_rule_test": [
                       {"eval_time": "3m", "alertname": "VllmInstanceDown", "exp_alerts": []},
                       {"eval_time": "5m", "alertname": "VllmInstanceDown", "exp_alerts": [{
                           "exp_labels": {"severity": "critical", "job": "vllm", "model": "tiny-llama",
                                          "host": "lab1", "instance": "default", "release": "0.32.0-cpu"},
                           "exp_annotations": {
                               "summary": "lab1/default (tiny-llama) cannot be scraped"}}]}]}],
    }))
    out = subprocess.run(["promtool", "test", "rules", str(tmp_path / "t.yml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("field, value, said", [
    ("job", 'vllm"}) or up{job="x', "--job"), ("job", "", "--job"),
    ("down_for", "1 minute", "--down-for"), ("down_for", "5", "--down-for"),
    ("ttft_p99_target_s", 0.0, "--ttft-p99-target"),
])
def test_settings_written_into_promql_are_refused_unless_plain(field, value, said):
    with pytest.raises(observe.ObserveError, match=said):
        fleet(**{field: value})
    fleet(job="prod-vllm:eu.1", down_for="1h30m")  # plain ones pass


def test_a_post_release_reads_its_base_releases_names():
    f = fleet(releases=("0.34.0.post1",))
    assert "vllm:kv_cache_usage_perc{" in observe.dashboard_json(f)
