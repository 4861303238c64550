"""Issue 6 on three real lab hosts: canary + waves, the first failure stops the rollout, and an
unreachable host is named. Every host's /health is sampled every 0.5 s during the rollouts."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import fleetlab as lab
from fleetlab import pypimirror
from tests.hosts.conftest import INVENTORY, ROOT, api_get, deploy, on, unit_props, wrong_shape_model
from tests.hosts.inventory import HOSTS_ENV
from vllm_fleet.controller.load import Load, summary
from vllm_fleet.core import lb as lb_core
from vllm_fleet.core import observe
from vllm_fleet.core.spec import deep_merge

HOSTS = ["lab1", "lab2", "lab3"]
POLL = ("systemd-run --quiet --collect --unit=rollout-poll sh -c 'for i in $(seq 1 {n}); do "
        "echo $(date +%s%N | cut -c1-11) $(curl -s -o /dev/null -m 3 -w %{{http_code}} "
        "http://127.0.0.1:8000/health) >> /tmp/rollout-poll.log; sleep 0.5; done'")


@pytest.fixture(scope="module")
def three_hosts(deployed):
    lab.up(3)
    before = os.environ.get(HOSTS_ENV)
    os.environ[HOSTS_ENV] = ",".join([*HOSTS, "lab8"])  # this module's fleet: every run below reads it
    try:
        run = deploy()
        assert run.rc == 0, run.output[-4000:]
        yield HOSTS
    finally:
        if before is None:
            os.environ.pop(HOSTS_ENV, None)
        else:
            os.environ[HOSTS_ENV] = before
        lab.remove(lab.LabHost(3))  # the other tests run on two hosts


def rollout(*args: str, overrides: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(overrides or {})}
    return subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "rollout", INVENTORY, *args],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=3000)


def start_polls(hosts: list[str]) -> None:
    for h in hosts:
        on(h, "rm -f /tmp/rollout-poll.log; " + POLL.format(n=3000))


def min_serving(hosts: list[str]) -> tuple[int, int]:
    """(fewest hosts answering 200 at any instant, instants checked): each host's samples make a step
    function (a host counts as serving from a 200 sample until its next sample), read on a 0.5 s grid
    over the span every host was sampling."""
    series = {}
    for h in hosts:
        text = on(h, "systemctl stop rollout-poll 2>/dev/null; cat /tmp/rollout-poll.log")
        series[h] = [(int(t) / 10, code == "200") for t, code in (line.split() for line in text.splitlines()
                                                                 if len(line.split()) == 2)]
    start = max(s[0][0] for s in series.values())
    end = min(s[-1][0] for s in series.values())
    grid = [start + 0.5 * i for i in range(int((end - start) / 0.5) + 1)]

    def up(samples: list[tuple[float, bool]], t: float) -> bool:
        return [ok for ts, ok in samples if ts <= t][-1]

    return min(sum(up(series[h], t) for h in hosts) for t in grid), len(grid)


def test_good_change_goes_canary_then_waves_and_never_more_than_one_host_down(three_hosts):
    pids = {h: unit_props(h)["MainPID"] for h in HOSTS}
    start_polls(HOSTS)
    proc = rollout("--canary", "1", "--wave", "1",
                   overrides={h: {"flags": {"max_num_seqs": 6}} for h in HOSTS})
    low, slots = min_serving(HOSTS)
    print(proc.stdout)
    print(f"minimum hosts serving during the rollout: {low} of 3 ({slots} sampled instants)")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for step in ("canary 1/3: lab1", "wave 2/3: lab2", "wave 3/3: lab3"):
        assert step in proc.stdout
    assert proc.stdout.index("canary 1/3") < proc.stdout.index("wave 2/3") < proc.stdout.index("wave 3/3")
    assert "updated: lab1, lab2, lab3" in proc.stdout and "rollout complete" in proc.stdout
    for h in HOSTS:
        assert unit_props(h)["MainPID"] != pids[h]
        assert "max-num-seqs: 6" in on(h, "cat /etc/vllm/default.yaml")
    assert slots > 20 and low >= 2  # the wave size is 1: never more than one host out at once


def fleet_cmd(cmd: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), cmd, INVENTORY, *args], cwd=ROOT,
                          env=os.environ, text=True, capture_output=True, timeout=3000)


def test_a_fleet_rollback_in_waves_says_so_per_host_and_names_a_host_it_could_not_roll_back(three_hosts):
    """After the rollout above (max_num_seqs 6 everywhere), `vllm-fleet rollback` over the three hosts,
    one per wave: every host rolls back, every wave runs, exit 0. Then lab2 is given no previous state:
    the next fleet rollback rolls lab1 back, stops at lab2 naming it and why, leaves lab3 as it was and
    exits 1."""
    proc = fleet_cmd("rollback", "--wave", "1")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "rolled back: lab1, lab2, lab3" in proc.stdout and "rollback complete" in proc.stdout
    for step in ("wave 1/3: lab1", "wave 2/3: lab2", "wave 3/3: lab3"):
        assert step in proc.stdout
    for h in HOSTS:
        assert "max-num-seqs: 8" in on(h, "cat /etc/vllm/default.yaml")
    on("lab2", "mv /var/lib/vllm-fleet/state.json /var/lib/vllm-fleet/state.json.aside && "
               "python3 -c 'import json; s=json.load(open(\"/var/lib/vllm-fleet/state.json.aside\")); "
               "s.pop(\"previous\", None); json.dump(s, open(\"/var/lib/vllm-fleet/state.json\", \"w\"))'")
    third = unit_props("lab3")
    try:
        partial = fleet_cmd("rollback", "--wave", "1")
    finally:
        on("lab2", "mv /var/lib/vllm-fleet/state.json.aside /var/lib/vllm-fleet/state.json")
    print(partial.stdout)
    assert partial.returncode == 1, partial.stdout[-4000:]
    assert "rolled back: lab1" in partial.stdout and "failed: lab2" in partial.stdout
    assert "lab2: nothing to roll back to: no previous deploy is recorded" in partial.stdout
    stopped = "rollback STOPPED at wave 2: later waves were not touched; left as they were: lab3"
    assert stopped in partial.stdout
    assert unit_props("lab3")["MainPID"] == third["MainPID"]
    # lab1 is left on the config it rolled back to: the next test's rollout updates it


def test_failure_on_the_second_host_stops_the_rollout_and_leaves_the_third_untouched(three_hosts):
    third = unit_props("lab3")
    proc = rollout("--canary", "1", "--wave", "1", overrides={  # fails after lab2's restart: rolled back
        "lab2": {"model": {"path": None, "host_path": wrong_shape_model("lab2")}}})
    print(proc.stdout)
    assert proc.returncode != 0
    assert "rollout STOPPED at wave 2" in proc.stdout
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in HOSTS and len(line.split()) > 3}
    assert rows["lab1"][2] == "updated" or rows["lab1"][2] == "unchanged"
    assert rows["lab2"][2:4] == ["rolled", "back"]
    assert rows["lab3"][2] == "untouched"
    assert unit_props("lab3") == third  # same MainPID, never restarted
    assert "/opt/vllm/models/tiny-llama/" in on("lab2", "cat /etc/vllm/default.yaml")


def test_an_unreachable_host_stops_the_rollout_naming_it(three_hosts):
    lab.halt(lab.LabHost(2))
    try:
        proc = rollout("--canary", "1", "--wave", "1")
        print(proc.stdout)
        assert proc.returncode != 0
        assert "rollout STOPPED at wave 2" in proc.stdout
        assert "unreachable: lab2" in proc.stdout
        assert "untouched: lab3" in proc.stdout
    finally:
        lab.up(3)  # boots lab2 again from its disk; its service starts by itself


# Issues 21 and 35: the same three hosts behind the front door on lab7, a plain host of the inventory:
# haproxy (the distribution's package) at the edge and per instance, vllm-router from PyPI (through
# the lab's PyPI mirror) per model. lab1 and lab2 serve the tiny model, lab3 the same files under a
# second name, tiny-b: a second model as the door sees it. Two tenants with their own keys.
LB = "lab7"
LB_URL = "http://10.77.7.2:8080"
TENANT_KEYS = {var: f"{var.lower()}-{secrets.token_hex(12)}"
               for var in ("TEAM_A_KEY", "TEAM_A_NEXT", "TEAM_B_KEY", "TEAM_C_KEY")}
TEAM_C_TOKENS = 60  # a few completions' worth
os.environ.update(TENANT_KEYS)  # the controller's environment: every run below inherits it


def door(team_a_keys: tuple[str, ...] = ("TEAM_A_KEY",)) -> dict:
    return {"port": 8080, "hosts": HOSTS, "check_interval_s": 1, "client_header_timeout_s": 2,
            "router": {"index_url": pypimirror.index_url()},
            # the lab's Prometheus runs on the controller: the door's metrics on the lab network
            "metrics": {"bind": "0.0.0.0"},
            "tenants": [{"name": "team-a", "key_envs": list(team_a_keys)},
                        {"name": "team-b", "key_envs": ["TEAM_B_KEY"], "models": ["tiny-b"],
                         "requests_per_min": 4},
                        {"name": "team-c", "key_envs": ["TEAM_C_KEY"], "tokens_per_min": TEAM_C_TOKENS}]}


BEHIND = {"lab1": {"flags": {"host": "0.0.0.0"}}, "lab2": {"flags": {"host": "0.0.0.0"}},
          "lab3": {"flags": {"host": "0.0.0.0", "served_model_name": "tiny-b"}},
          "__hostdata__": {LB: {"vllm_lb": door()}}}
MODEL_OF = {"lab1": "tiny-llama", "lab2": "tiny-llama", "lab3": "tiny-b"}


def door_servers() -> dict[str, dict]:
    """Every server of the door: the listeners, their backups and each model's router."""
    out = on(LB, "python3 /usr/local/lib/vllm-fleet/lbctl.py /run/vllm-fleet-lb.sock show")
    return {r["server"]: r for r in map(json.loads, out.splitlines())}


def lb_servers() -> dict[str, dict]:
    """The instances' own listeners (backend/server "<host>-default/<host>-default")."""
    return {n: r for n, r in door_servers().items() if n.split("/")[0] == n.split("/")[1]}


def through(path: str, key: str | None, body: dict | None = None, method: str = "POST") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=LB_URL, timeout=60) as c:
        return c.request(method, path, json=body, headers=headers)


def completions_served(h: str) -> int:
    """vLLM's own count of finished requests on the host (its /metrics, read on the host)."""
    status, text = api_get(h, "/metrics")
    assert status == 200, text[:300]
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{")))


@pytest.fixture(scope="module")
def balanced(three_hosts):
    lab.up(3, plain=2)  # lab7 joins as the front door
    pypimirror.start()
    os.environ[HOSTS_ENV] += f",{LB}"
    run = deploy("deploys/vllm.py deploys/lb.py", overrides=BEHIND)
    assert run.rc == 0, run.output[-4000:]
    for _ in range(60):  # the listeners' checks, and each model's router listening (it waits for one
        if all(r["status"] == "UP" for r in door_servers().values()):  # healthy instance first)
            break
        time.sleep(1)
    yield run
    pypimirror.stop()
    lab.remove(lab.LabHost(7, "plain"))


def test_the_door_checks_every_instance_with_a_completion_and_holds_no_key(balanced):
    assert set(lb_servers()) == {f"{h}-default/{h}-default" for h in HOSTS}
    assert all(r["status"] == "UP" and r["check"] == "L7OK" for r in lb_servers().values()), lb_servers()
    cfg = on(LB, "cat /etc/haproxy/haproxy.cfg /etc/haproxy/vllm-fleet/* "
                 "/etc/systemd/system/vllm-fleet-router-*")
    assert "uri /v1/completions" in cfg
    assert not [k for k in (os.environ["VLLM_API_KEY"], *TENANT_KEYS.values()) if k in cfg]
    assert on(LB, "stat -c %a:%U /etc/haproxy/vllm-fleet.env").strip() == "600:root"
    again = deploy("deploys/lb.py", overrides=BEHIND, limit=LB)
    assert again.rc == 0 and again.changed_ops() == [], again.changed_ops()


def test_one_endpoint_routes_by_model_through_each_models_router(balanced):
    models = through("/v1/models", TENANT_KEYS["TEAM_A_KEY"], method="GET")
    assert models.status_code == 200 and {m["id"] for m in models.json()["data"]} == {"tiny-llama", "tiny-b"}
    before = {h: completions_served(h) for h in HOSTS}
    for model, n in (("tiny-llama", 6), ("tiny-b", 3)):
        for i in range(n):
            r = through("/v1/completions", TENANT_KEYS["TEAM_A_KEY"],
                        {"model": model, "prompt": f"turn {i}", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == model, r.text[:300]
    served = {h: completions_served(h) - before[h] for h in HOSTS}
    # lab3 alone serves tiny-b; the tiny model's six went to lab1 and lab2 (the door's own one-token
    # checks go to the listeners, not through the routers, and are counted too: at least, not exactly)
    assert served["lab3"] >= 3 and served["lab1"] + served["lab2"] >= 6, served
    unknown = through("/v1/completions", TENANT_KEYS["TEAM_A_KEY"], {"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404 and "tiny-llama" in unknown.text and "tiny-b" in unknown.text
    # the routers are in the path: each model's router counted its requests
    metrics = on(LB, "curl -s 127.0.0.1:32000/metrics; curl -s 127.0.0.1:32001/metrics")
    assert "vllm_router" in metrics, metrics[:500]


def test_tenants_keys_models_and_limits_at_the_door(balanced):
    body = {"model": "tiny-b", "prompt": "hi", "max_tokens": 1}
    assert through("/v1/completions", None, body).status_code == 401
    assert through("/v1/completions", os.environ["VLLM_API_KEY"], body).status_code == 401  # vLLM's own key
    assert through("/v1/completions", "team-a-guess", body).status_code == 401
    llama = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}
    assert through("/v1/completions", TENANT_KEYS["TEAM_B_KEY"], llama).status_code == 403
    codes = [through("/v1/completions", TENANT_KEYS["TEAM_B_KEY"], body).status_code for _ in range(5)]
    assert codes.count(429) >= 1 and codes[0] == 200, codes  # 4 a minute, the 403 above counted
    # team-b's limit is team-b's alone
    assert through("/v1/completions", TENANT_KEYS["TEAM_A_KEY"], llama).status_code == 200


def test_only_the_api_routes_pass_the_door(balanced):
    routes = json.loads(on("lab1", "cat /var/lib/vllm-fleet/staged/default.yaml.routes.json").strip())
    paths = sorted({r["path"] for r in routes if "{" not in r["path"]})
    assert "/metrics" in paths and "/v1/completions" in paths, paths
    allowed = {"/v1/models", *lb_core.API_ROUTES}
    key = TENANT_KEYS["TEAM_A_KEY"]
    for p in paths:
        r = through(p, key, {"model": "tiny-llama"}, method="GET" if p == "/v1/models" else "POST")
        refused = r.status_code == 404 and "not an API route of this endpoint" in r.text
        assert refused == (p not in allowed), (p, r.status_code, r.text[:200])


def test_key_rotation_and_revocation_reload_the_door_and_never_restart_vllm(balanced):
    pids = {h: unit_props(h)["MainPID"] for h in HOSTS}
    body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}
    both = {**BEHIND, "__hostdata__": {LB: {"vllm_lb": door(("TEAM_A_KEY", "TEAM_A_NEXT"))}}}
    run = deploy("deploys/lb.py", overrides=both, limit=LB)
    assert run.rc == 0, run.output[-3000:]
    assert [through("/v1/completions", TENANT_KEYS[k], body).status_code
            for k in ("TEAM_A_KEY", "TEAM_A_NEXT")] == [200, 200]
    only_next = {**BEHIND, "__hostdata__": {LB: {"vllm_lb": door(("TEAM_A_NEXT",))}}}
    run = deploy("deploys/lb.py", overrides=only_next, limit=LB)
    assert run.rc == 0, run.output[-3000:]
    assert [through("/v1/completions", TENANT_KEYS[k], body).status_code
            for k in ("TEAM_A_KEY", "TEAM_A_NEXT")] == [401, 200]
    assert {h: unit_props(h)["MainPID"] for h in HOSTS} == pids
    for h in HOSTS:  # tenant keys reach no vLLM host: files, units, argv, journal
        seen = on(h, "cat /etc/vllm/* /etc/systemd/system/vllm-* /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; "
                     "journalctl --no-pager -o cat -u 'vllm-*'")
        assert not [k for k in TENANT_KEYS.values() if k in seen], h
    assert deploy("deploys/lb.py", overrides=BEHIND, limit=LB).rc == 0  # back to the module's door


def test_tenants_usage_reaches_prometheus_and_the_token_limit_holds(balanced, tmp_path):
    from tests.hosts.test_prometheus import fleet, prometheus, series, wait_for

    key = TENANT_KEYS["TEAM_C_KEY"]
    unbounded = through("/v1/completions", key, {"model": "tiny-b", "prompt": "hi", "stream": True})
    assert unbounded.status_code == 400 and "max_tokens" in unbounded.text, unbounded.text
    streamed = through("/v1/completions", key, {"model": "tiny-b", "prompt": "hi", "stream": True,
                                                 "max_tokens": 3})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    used, codes = 3, []  # the stream is charged its max_tokens
    for i in range(12):
        r = through("/v1/completions", key, {"model": "tiny-llama", "prompt": f"count {i}", "max_tokens": 8})
        codes.append(r.status_code)
        if r.status_code != 200:
            break
        used += r.json()["usage"]["total_tokens"]
    # refused once the last minute's tokens reached the limit, not before
    assert codes[-1] == 429 and codes.count(200) >= 2 and used >= TEAM_C_TOKENS, (codes, used)
    out = tmp_path / "targets.json"
    proc = fleet("targets", INVENTORY, "--output", str(out), overrides=BEHIND)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doors = [g for g in json.loads(out.read_text()) if g["labels"]["host"] == LB]
    assert {g["labels"]["endpoint"] for g in doors} == {"haproxy", "tenants"}, doors
    with prometheus(tmp_path, out) as (client, log):
        def tokens() -> float | None:
            got = series(client, 'sum(vllm_fleet_door_tokens_total{tenant="team-c"})')
            return float(got[0]["value"][1]) if got else None
        seen = wait_for(lambda: tokens() == used, 60,
                        lambda: f"team-c's tokens in Prometheus: {tokens()}, counted here {used}\n"
                                f"{log.read_text()[-2000:]}")
        assert seen
        refused = series(client, 'vllm_fleet_door_requests_total{tenant="team-c",code="429"}')
        assert refused and float(refused[0]["value"][1]) >= 1, refused
        assert series(client, 'vllm_fleet_door_requests_total{tenant="team-c",code="400"}')
        # haproxy's own exporter, beside: each instance's listener and its completion check
        query = 'haproxy_server_status{proxy="lab1-default",server="lab1-default",state="UP"}'
        up = wait_for(lambda: series(client, query), 30,
                      lambda: f"no {query}: {client.get('/api/v1/targets').text[-3000:]}")
        assert up[0]["value"][1] == "1", up
        # the generated dashboard's door panels, each query run against this Prometheus: none empty
        dash = tmp_path / "dash"
        dash.mkdir()
        made = fleet("dashboards", INVENTORY, "--output", str(dash), overrides=BEHIND)
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        panels = json.loads((dash / observe.DASHBOARD_FILE).read_text())["panels"]
        door_panels = [p for p in panels if p["title"].startswith("Door:")]
        assert len(door_panels) == 4, [p["title"] for p in panels]
        for p in door_panels:
            for t in p["targets"]:
                expr = observe.concrete(t["expr"])
                wait_for(lambda e=expr: series(client, e), 30,
                         lambda e=expr, p=p: f"{p['title']}: no series for {e}")


def test_a_hung_instance_leaves_rotation_within_the_bound(balanced):
    """lab1's vLLM is frozen (SIGSTOP to its whole unit): its listener's completion check times out,
    and the door serves the tiny model from lab2 alone until lab1 answers again."""
    bound = lb_core.failure_bound_s(lb_core.LbSpec.model_validate(door()))
    body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 1}
    on("lab1", "systemctl kill -s SIGSTOP vllm-default")
    try:
        frozen = time.monotonic()
        while (not lb_servers()["lab1-default/lab1-default"]["status"].startswith("DOWN")
               and time.monotonic() - frozen < 60):
            time.sleep(0.5)
        out_after = time.monotonic() - frozen
        print(f"hung lab1 out of rotation after {out_after:.1f} s (bound {bound} s)")
        assert lb_servers()["lab1-default/lab1-default"]["status"].startswith("DOWN"), lb_servers()
        assert out_after <= bound + 2, (out_after, bound)  # + this loop's own poll (SSH, 0.5 s sleeps)
        key = TENANT_KEYS["TEAM_A_KEY"]
        answers = [through("/v1/completions", key, {**body, "prompt": f"hi {i}"}) for i in range(6)]
        assert [r.status_code for r in answers] == [200] * 6, (
            [(r.status_code, r.text[:200]) for r in answers], lb_servers(),
            on(LB, "python3 /usr/local/lib/vllm-fleet/lbctl.py /run/vllm-fleet-lb.sock show; "
                   "journalctl --no-pager -o cat -n 40 -u 'vllm-fleet-router-*'"))
    finally:
        on("lab1", "systemctl kill -s SIGCONT vllm-default")
    for _ in range(30):
        if lb_servers()["lab1-default/lab1-default"]["status"] == "UP":
            break
        time.sleep(1)
    assert lb_servers()["lab1-default/lab1-default"]["status"] == "UP", lb_servers()


def test_tls_and_the_body_and_slow_client_limits_at_the_door(balanced, tmp_path):
    big = {"model": "tiny-llama", "prompt": "x" * (1024 * 1024 + 1), "max_tokens": 1}
    r = through("/v1/completions", TENANT_KEYS["TEAM_A_KEY"], big)
    assert r.status_code == 413, r.text[:200]
    # a client that never finishes its header is answered 408 after client_header_timeout_s
    with socket.create_connection(("10.77.7.2", 8080), timeout=30) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: door\r\n")
        t0 = time.monotonic()
        answer = slow.recv(4096)
        waited = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408") and 1.5 < waited < 10, (answer[:100], waited)
    # a certificate the door's host holds (the operator's to place there), named in the inventory
    on(LB, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=door "
           "-addext subjectAltName=IP:10.77.7.2 -keyout /tmp/door.key -out /tmp/door.crt 2>/dev/null && "
           "cat /tmp/door.crt /tmp/door.key > /etc/haproxy/door.pem && chmod 600 /etc/haproxy/door.pem")
    ca = tmp_path / "door.crt"
    ca.write_text(on(LB, "cat /tmp/door.crt"))
    pem = "/etc/haproxy/door.pem"
    tls = {**BEHIND, "__hostdata__": {LB: {"vllm_lb": {**door(), "tls_certificate": pem}}}}
    try:
        run = deploy("deploys/lb.py", overrides=tls, limit=LB)
        assert run.rc == 0, run.output[-3000:]
        trusted = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(base_url=LB_URL.replace("http:", "https:"), verify=trusted, timeout=60) as c:
            r = c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 1},
                       headers={"Authorization": f"Bearer {TENANT_KEYS['TEAM_A_KEY']}"})
        assert r.status_code == 200 and r.json()["model"] == "tiny-llama", r.text[:300]
        with pytest.raises(httpx.TransportError):  # plain HTTP is no longer spoken on the port
            through("/v1/models", TENANT_KEYS["TEAM_A_KEY"], method="GET")
    finally:
        assert deploy("deploys/lb.py", overrides=BEHIND, limit=LB).rc == 0  # back to the module's door


def test_rollout_under_load_through_the_door_fails_no_request(balanced):
    load = Load(LB_URL, "tiny-llama", TENANT_KEYS["TEAM_A_KEY"], rate_per_s=4, max_s=600).start()
    time.sleep(8)
    began = load.mark()
    proc = rollout("--canary", "1", "--wave", "1",
                   overrides={**BEHIND, **{h: deep_merge(BEHIND[h], {"flags": {"max_num_seqs": 5}})
                                           for h in HOSTS}})
    ended = load.mark()
    time.sleep(3)
    load.stop()
    before = summary([s for s in load.samples if s.t < began])
    during = summary([s for s in load.samples if began <= s.t <= ended])
    print(proc.stdout)
    print(f"through the door: before {before}; during the rollout {during}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "updated: lab1, lab2, lab3" in proc.stdout
    for h in HOSTS:
        assert "max-num-seqs: 5" in on(h, "cat /etc/vllm/default.yaml")
    assert during["sent"] > 100, during
    assert during["failed"] == 0, [s.detail for s in load.samples if not s.ok][:5]
    assert all(r["status"] == "UP" for r in lb_servers().values()), lb_servers()  # ready again


def test_status_shows_the_door_per_model_and_per_tenant(balanced):
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(BEHIND)}
    proc = subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "status", INVENTORY], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(f"{LB} ")]
    # the tenants' table has 7 columns too; haproxy marks a check in progress with "* " (8 words)
    servers = [r for r in rows if len(r) in (7, 8) and "/" in r[2]]
    assert {(r[1], r[2]) for r in servers} == {(MODEL_OF[h], f"{h}-default/{h}-default") for h in HOSTS}, \
        proc.stdout[-2000:]
    assert all(r[3] == "UP" and r[4] == "ready" for r in servers), servers
    tenants = {r[1]: r for r in rows if r[1].startswith("team-")}
    assert set(tenants) == {"team-a", "team-b", "team-c"}, proc.stdout[-2000:]
    # DOOR TENANT REQUESTS/60S REQUESTS 4XX TOKENS TOKENS/60S, counted since haproxy's last reload:
    # the rollout under load sent team-a's requests since
    assert all(x.isdigit() for t in tenants.values() for x in t[2:]), proc.stdout[-2000:]
    assert int(tenants["team-a"][3]) > 100 and int(tenants["team-a"][5]) > 100, proc.stdout[-2000:]


def test_a_restart_lets_a_streaming_request_finish(balanced):
    """Without the load balancer: the unit's stop drains in-flight requests (--shutdown-timeout), so a
    stream that started before the restart ends with [DONE]."""
    key = "$(sed -n 's/^VLLM_API_KEY=\"\\(.*\\)\"$/\\1/p' /etc/vllm/default.env)"
    body = json.dumps({"model": "tiny-llama", "prompt": "Hi", "max_tokens": 400, "ignore_eos": True,
                       "stream": True})
    stream = (f"curl -sN -m 120 http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' "
              f"-H \"Authorization: Bearer {key}\" -d '{body}' > /tmp/stream.out 2>&1")
    on("lab1", "rm -f /tmp/stream.out; systemd-run --quiet --collect --unit=stream-probe sh -c "
               + shlex.quote(stream))
    for _ in range(50):
        if on("lab1", "grep -c '^data: {' /tmp/stream.out 2>/dev/null").strip() not in ("", "0"):
            break
        time.sleep(0.1)
    on("lab1", "systemctl restart vllm-default")
    for _ in range(120):
        if on("lab1", "systemctl is-active stream-probe").strip() != "active":
            break
        time.sleep(0.5)
    out = on("lab1", "cat /tmp/stream.out")
    assert out.rstrip().endswith("data: [DONE]"), out[-600:]
    chunks = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # all 400 tokens, not cut short
    # and it really was in flight when the unit was stopped: vLLM says it waited for it
    log = on("lab1", "journalctl -u vllm-default -n 900 --no-pager -o cat | grep -F '[shutdown]' | tail -20")
    assert "draining in-flight requests count=1" in log, log


def test_a_host_whose_change_fails_stays_drained_until_a_deploy_passes(balanced):
    bad = {**BEHIND, "lab2": {"flags": {"host": "0.0.0.0"},  # fails after the restart: rolled back
                              "model": {"path": None, "host_path": wrong_shape_model("lab2")}}}
    run = deploy(overrides=bad, limit="lab2")
    assert run.rc != 0 and "lab2: change failed and was rolled back" in run.output, run.output[-3000:]
    assert "drained in lab7" in run.output
    assert lb_servers()["lab2-default/lab2-default"]["admin"] == "drain", lb_servers()
    assert [(r["status"], r["admin"]) for n, r in sorted(lb_servers().items())
            if n != "lab2-default/lab2-default"] == [("UP", "ready"), ("UP", "ready")]
    good = deploy(overrides=BEHIND, limit="lab2")  # nothing to change: the smoke test passes, back in
    assert good.rc == 0, good.output[-3000:]
    assert "ready in lab7" in good.output
    for _ in range(20):
        if lb_servers()["lab2-default/lab2-default"]["status"] == "UP":
            break
        time.sleep(1)
    row = lb_servers()["lab2-default/lab2-default"]
    assert (row["status"], row["admin"]) == ("UP", "ready"), lb_servers()
