"""Issue 6 on three real lab hosts: canary + waves, the first failure stops the rollout, and an
unreachable host is named. Every host's /health is sampled every 0.5 s during the rollouts."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import fleetlab as lab
from tests.hosts.conftest import INVENTORY, ROOT, deploy, on, unit_props
from tests.hosts.inventory import HOSTS_ENV
from vllm_fleet.controller.load import Load, summary

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
    proc = rollout("--canary", "1", "--wave", "1", overrides={
        "lab2": {"model": {"path": None, "host_path": "/opt/vllm/models/not-there"}}})
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


# Issue 21: the same three hosts behind a real haproxy (the distribution's package) on lab7, a plain
# host of the inventory; the health check is a real completion with the key.
LB = "lab7"
LB_URL = "http://10.77.7.2:8080"
BEHIND = {**{h: {"flags": {"host": "0.0.0.0"}} for h in HOSTS},
          "__hostdata__": {LB: {"vllm_lb": {"port": 8080, "hosts": HOSTS, "check_interval_s": 1}}}}


def lb_servers() -> dict[str, dict]:
    out = on(LB, "python3 /usr/local/lib/vllm-fleet/lbctl.py /run/vllm-fleet-lb.sock show")
    return {r["server"]: r for r in map(json.loads, out.splitlines())}


@pytest.fixture(scope="module")
def balanced(three_hosts):
    lab.up(3, plain=2)  # lab7 joins as the load balancer
    os.environ[HOSTS_ENV] += f",{LB}"
    run = deploy("deploys/vllm.py deploys/lb.py", overrides=BEHIND)
    assert run.rc == 0, run.output[-4000:]
    for _ in range(30):
        if all(r["status"] == "UP" for r in lb_servers().values()):
            break
        time.sleep(1)
    yield run
    lab.remove(lab.LabHost(7, "plain"))


def test_haproxy_fronts_every_instance_with_a_completion_check_and_no_key_in_its_config(balanced):
    assert set(lb_servers()) == {f"vllm/{h}-default" for h in HOSTS}
    assert all(r["status"] == "UP" and r["check"] == "L7OK" for r in lb_servers().values()), lb_servers()
    cfg = on(LB, "cat /etc/haproxy/haproxy.cfg")
    assert "uri /v1/completions" in cfg and os.environ["VLLM_API_KEY"] not in cfg
    assert on(LB, "stat -c %a:%U /etc/haproxy/vllm-fleet.env").strip() == "600:root"
    key = os.environ["VLLM_API_KEY"]
    with httpx.Client(base_url=LB_URL, timeout=30) as c:
        ok = c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2},
                    headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert c.post("/v1/completions", json={"model": "tiny-llama", "prompt": "hi"}).status_code == 401
    again = deploy("deploys/lb.py", overrides=BEHIND, limit=LB)
    assert again.rc == 0 and again.changed_ops() == [], again.changed_ops()


def test_rollout_under_load_through_haproxy_fails_no_request(balanced):
    load = Load(LB_URL, "tiny-llama", os.environ["VLLM_API_KEY"], rate_per_s=4, max_s=600).start()
    time.sleep(8)
    began = load.mark()
    proc = rollout("--canary", "1", "--wave", "1",
                   overrides={**BEHIND, **{h: {"flags": {"host": "0.0.0.0", "max_num_seqs": 5}}
                                           for h in HOSTS}})
    ended = load.mark()
    time.sleep(3)
    load.stop()
    before = summary([s for s in load.samples if s.t < began])
    during = summary([s for s in load.samples if began <= s.t <= ended])
    print(proc.stdout)
    print(f"through haproxy: before {before}; during the rollout {during}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "updated: lab1, lab2, lab3" in proc.stdout
    for h in HOSTS:
        assert "max-num-seqs: 5" in on(h, "cat /etc/vllm/default.yaml")
    assert during["sent"] > 100, during
    assert during["failed"] == 0, [s.detail for s in load.samples if not s.ok][:5]
    assert all(r["status"] == "UP" for r in lb_servers().values()), lb_servers()  # ready again


def test_status_shows_each_server_in_the_load_balancer(balanced):
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(BEHIND)}
    proc = subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "status", INVENTORY], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(f"{LB} ")]
    assert sorted(r[1] for r in rows) == [f"vllm/{h}-default" for h in HOSTS], proc.stdout[-2000:]
    assert all(r[2] == "UP" and r[3] == "ready" for r in rows), rows


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
    bad = {**BEHIND, "lab2": {"flags": {"host": "0.0.0.0"},
                              "model": {"path": None, "host_path": "/opt/vllm/models/not-there"}}}
    run = deploy(overrides=bad, limit="lab2")
    assert run.rc != 0 and "lab2: change failed and was rolled back" in run.output, run.output[-3000:]
    assert "drained in lab7" in run.output
    assert lb_servers()["vllm/lab2-default"]["admin"] == "drain", lb_servers()
    assert [(r["status"], r["admin"]) for n, r in sorted(lb_servers().items()) if n != "vllm/lab2-default"] \
        == [("UP", "ready"), ("UP", "ready")]
    good = deploy(overrides=BEHIND, limit="lab2")  # nothing to change: the smoke test passes, back in
    assert good.rc == 0, good.output[-3000:]
    assert "ready in lab7" in good.output
    for _ in range(20):
        if lb_servers()["vllm/lab2-default"]["status"] == "UP":
            break
        time.sleep(1)
    assert (lb_servers()["vllm/lab2-default"]["status"], lb_servers()["vllm/lab2-default"]["admin"]) == \
        ("UP", "ready"), lb_servers()
