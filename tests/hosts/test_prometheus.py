"""`vllm-fleet targets` and `vllm-fleet logs` on real lab hosts: the generated file_sd file is read by a
real Prometheus (Debian's package, installed by scripts/setup.sh) that scrapes lab1's vLLM over the lab
network, and the journal of the running instance is read back through pyinfra."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import fleetlab as lab
from tests.hosts.conftest import INVENTORY, ROOT, deploy, on, unit_props

PROMETHEUS = "/usr/bin/prometheus"
VLLM_FLEET = str(Path(sys.executable).parent / "vllm-fleet")
# lab1 listens on every address (with the key, as the plan requires) and opens /metrics to Prometheus
# (the key guard covers every other route); lab2 keeps the lab's loopback bind
BOUND = {"lab1": {"flags": {"host": "0.0.0.0"}, "open_paths": ["/health", "/metrics"]}}


def fleet(*args: str, overrides: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(overrides or {})}
    return subprocess.run([VLLM_FLEET, *args], cwd=ROOT, env=env, text=True, capture_output=True,
                          timeout=600)


@pytest.fixture(scope="module")
def network_bound(deployed):
    """lab1 serving on the lab network; afterwards the session's own deploy again, for the other tests."""
    run = deploy(overrides=BOUND, limit="lab1")
    assert run.rc == 0, run.output[-4000:]
    yield run
    back = deploy(limit="lab1")
    assert back.rc == 0, back.output[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prometheus(tmp: Path, targets_file: Path,
               rules: Path | None = None) -> Iterator[tuple[httpx.Client, Path]]:
    """Our own Prometheus process (never the package's service): 1 s scrapes of the file_sd file's
    targets (and 1 s evaluations of `rules`), its data and log under `tmp`, killed on the way out."""
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} is missing: scripts/setup.sh installs it as root (make test does), or "
                    "apt-get install -y --no-install-recommends prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [{"files": [str(targets_file)]}]}],
        **({"rule_files": [str(rules)]} if rules else {}),
    }))
    log = tmp / "prometheus.log"
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            wait_for(lambda: _ready(client, proc), 60,
                     lambda: f"Prometheus not ready:\n{log.read_text()[-3000:]}")
            yield client, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(client: httpx.Client, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"Prometheus exited with {proc.returncode}")
    try:
        return client.get("/-/ready").status_code == 200
    except httpx.TransportError:
        return False


def wait_for(probe, timeout_s: float, why) -> Any:
    """The probe's first truthy result, polled every 0.5 s; fails with why() when it never comes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(why())


def scraped_target(client: httpx.Client, host: str) -> dict | None:
    """The active target of `host` once its scrape succeeded."""
    active = client.get("/api/v1/targets", params={"state": "active"}).json()["data"]["activeTargets"]
    return next((t for t in active if t["labels"].get("host") == host and t["health"] == "up"), None)


def series(client: httpx.Client, query: str) -> list[dict]:
    body = client.get("/api/v1/query", params={"query": query}).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_targets_file_is_scraped_by_a_real_prometheus_with_the_fleet_labels(network_bound, tmp_path):
    out = tmp_path / "file_sd" / "vllm.json"
    out.parent.mkdir()
    proc = fleet("targets", INVENTORY, "--output", str(out), overrides=BOUND)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    release = on("lab1", "readlink /opt/vllm/current").strip().rsplit("/", 1)[-1]  # 0.32.0-cpu
    labels = {"host": "lab1", "instance": "default", "model": "tiny-llama", "release": release}
    groups = json.loads(out.read_text())
    assert [g for g in groups if g["labels"]["host"] == "lab1"] == [
        {"targets": [f"{lab.LabHost(1).address}:8000"], "labels": labels}]
    assert not [g for g in groups if g["labels"]["host"] == "lab2"]  # loopback: not reachable
    summary = [line for line in proc.stdout.splitlines() if line.startswith("targets: ")]
    assert len(summary) == 1 and f"written to {out}" in summary[0], proc.stdout[-2000:]
    assert "lab2/default (binds 127.0.0.1)" in summary[0]
    assert [p.name for p in out.parent.iterdir()] == ["vllm.json"]  # no temp file left behind

    with prometheus(tmp_path, out) as (client, log):
        target = wait_for(lambda: scraped_target(client, "lab1"), 60,
                          lambda: f"lab1 never up: {client.get('/api/v1/targets').text[-3000:]}\n"
                                  f"{log.read_text()[-2000:]}")
        # no key in Prometheus' config: the inventory opened /metrics
        assert target["scrapeUrl"] == f"http://{lab.LabHost(1).address}:8000/metrics"
        assert target["labels"] == {**labels, "job": "vllm"}, target
        running = wait_for(lambda: [s for s in series(client, "vllm:num_requests_running")
                                    if s["metric"].get("host") == "lab1"], 30,
                           lambda: f"no vllm:num_requests_running from lab1: "
                                   f"{series(client, 'vllm:num_requests_running')}")
        metric = running[0]["metric"]
        assert {k: metric.get(k) for k in labels} == labels, metric
        assert metric["model_name"] == "tiny-llama"  # vLLM's own label, beside ours

        # a rerun (a cron job's) replaces the file under the watching Prometheus with the same bytes
        written = out.read_bytes()
        again = fleet("targets", INVENTORY, "--output", str(out), overrides=BOUND)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert out.read_bytes() == written
        time.sleep(3)
        assert scraped_target(client, "lab1") is not None


def test_logs_show_the_running_instances_start_up(network_bound):
    pid = unit_props("lab1")["MainPID"]
    proc = fleet("logs", INVENTORY, "--limit", "lab1", "--instance", "default", "--lines", "3000",
                 overrides=BOUND)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    head = "== lab1 / default (vllm-default.service) =="
    assert head in proc.stdout and "== lab2 " not in proc.stdout, proc.stdout[-3000:]
    block = proc.stdout.split(head, 1)[1]
    # this process's start-up, not an earlier one's: "<time> lab1 vllm[<pid>]: (APIServer pid=<pid>) ..."
    started = [line for line in block.splitlines() if (f"[{pid}]:" in line or f"pid={pid})" in line)
               and ("Starting vLLM" in line or "non-default args" in line)]
    assert started, block[-3000:]

    unknown = fleet("logs", INVENTORY, "--instance", "nope", overrides=BOUND)
    said = unknown.stdout + unknown.stderr
    assert unknown.returncode != 0
    assert "no instance 'nope' on " in said and "lab1: default" in said and "lab2: default" in said, said


DOWN_FOR_S = 5


def test_dashboards_every_panel_and_rule_returns_series_and_the_down_alert_fires(network_bound, tmp_path):
    """`vllm-fleet dashboards` for lab1 (vLLM 0.32.0, CPU build): the real Prometheus loads its rules,
    every panel query and every alert's compared expression returns series from lab1's real vLLM, the
    preview draws every panel (opened in headless Chromium and screenshot), and a stopped instance fires
    VllmInstanceDown once its `for:` has passed. Last in this module: lab1 is stopped at the end and the
    fixture's own redeploy starts it again."""
    from tests import browser
    from vllm_fleet.core import observe

    out = tmp_path / "dash"
    out.mkdir()
    made = fleet("dashboards", INVENTORY, "--limit", "lab1", "--output", str(out), "--down-for",
                 f"{DOWN_FOR_S}s", overrides=BOUND)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    line = next(x for x in made.stdout.splitlines() if x.startswith("dashboards: "))
    assert "vLLM 0.32.0" in line and "models tiny-llama" in line, line
    model = json.loads((out / observe.DASHBOARD_FILE).read_text())
    rules = out / observe.RULES_FILE
    check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    targets = tmp_path / "vllm.json"
    assert fleet("targets", INVENTORY, "--output", str(targets), overrides=BOUND).returncode == 0
    key = os.environ["VLLM_API_KEY"]
    url = f"http://{lab.LabHost(1).address}:8000/v1/completions"

    with prometheus(tmp_path, targets, rules) as (client, log):
        wait_for(lambda: scraped_target(client, "lab1"), 60,
                 lambda: f"lab1 never up: {client.get('/api/v1/targets').text[-3000:]}\n"
                         f"{log.read_text()[-2000:]}")
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as api:
            # the same prompt again: prefix-cache hits; several tokens: inter-token latency
            for i in range(8):
                r = api.post(url, json={"model": "tiny-llama", "prompt": "the fleet " * 8, "max_tokens": 8,
                                        "stream": i % 2 == 0})
                assert r.status_code == 200, r.text[:300]
                time.sleep(0.5)

        queries = [(p["title"], t["expr"]) for p in model["panels"] for t in p["targets"]]
        queries += [(f"alert {a['alert']}", a["expr"].rsplit(" ", 2)[0])
                    for g in yaml.safe_load(rules.read_text())["groups"] for a in g["rules"] if "alert" in a]
        for title, expr in queries:
            concrete = observe.concrete(expr)
            wait_for(lambda e=concrete: series(client, e), 60,
                     lambda t=title, e=concrete: f"{t}: no series for {e}")
        groups = client.get("/api/v1/rules").json()["data"]["groups"]
        evaluated = [r for g in groups for r in g["rules"]]
        assert len(evaluated) == 11 and all(r["health"] == "ok" for r in evaluated), evaluated

        # the preview: every panel drawn from this Prometheus, opened in Chromium as a person would
        page = tmp_path / "dashboard.html"
        drawn = subprocess.run([VLLM_FLEET, "preview", str(out / observe.DASHBOARD_FILE), "--prometheus",
                                str(client.base_url).rstrip("/"), "--minutes", "2", "--output", str(page),
                                "--strict"], capture_output=True, text=True, timeout=120)
        assert drawn.returncode == 0, drawn.stdout + drawn.stderr
        assert f"{len(model['panels'])} panels (0 without data)" in drawn.stdout, drawn.stdout
        built = browser.dom(page)
        for p in model["panels"]:
            assert f'data-title="{p["title"]}"' in built, p["title"]
        assert 'class="nodata"' not in built
        png = browser.screenshot(page, tmp_path / "dashboard.png", 1000, 1500)
        stroke = re.search(r'class="series"[^>]*stroke="(#[0-9a-fA-F]{6})"|'
                           r'stroke="(#[0-9a-fA-F]{6})"[^>]*class="series"', built)
        assert stroke, built[:3000]
        colour = stroke.group(1) or stroke.group(2)
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        assert browser.colour_pixels(png, rgb) > 500, f"no {colour} line in the screenshot {png}"
        artifacts = os.environ.get("VLLM_FLEET_ARTIFACTS")
        if artifacts:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            (Path(artifacts) / "dashboard.png").write_bytes(png.read_bytes())

        # a stopped instance: the down alert fires once `for:` has passed
        on("lab1", "systemctl stop vllm-default")
        stopped = time.monotonic()

        def firing() -> list[dict]:
            alerts = client.get("/api/v1/alerts").json()["data"]["alerts"]
            return [a for a in alerts if a["labels"].get("alertname") == "VllmInstanceDown"
                    and a["labels"].get("host") == "lab1" and a["state"] == "firing"]

        fired = wait_for(firing, 60,
                         lambda: f"VllmInstanceDown never fired: {client.get('/api/v1/alerts').text}")
        after = time.monotonic() - stopped
        print(f"VllmInstanceDown fired {after:.1f} s after the stop (for: {DOWN_FOR_S}s)")
        assert fired[0]["labels"]["severity"] == "critical"
        # for: plus a failed scrape (1 s timeout), one evaluation (1 s) and this loop's poll
        assert DOWN_FOR_S <= after <= DOWN_FOR_S + 5, after
