"""Issue 6 on three real lab hosts: canary + waves, the first failure stops the rollout, and an
unreachable host is named. Every host's /health is sampled every 0.5 s during the rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import lab
from tests.hosts.conftest import INVENTORY, ROOT, deploy, on, unit_props

HOSTS = ["lab1", "lab2", "lab3"]
POLL = ("systemd-run --quiet --collect --unit=rollout-poll sh -c 'for i in $(seq 1 {n}); do "
        "echo $(date +%s%N | cut -c1-11) $(curl -s -o /dev/null -m 3 -w %{{http_code}} "
        "http://127.0.0.1:8000/health) >> /tmp/rollout-poll.log; sleep 0.5; done'")


@pytest.fixture(scope="module")
def three_hosts(deployed):
    lab.up(3)
    run = deploy()
    assert run.rc == 0, run.output[-4000:]
    yield HOSTS
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


def test_failure_on_the_second_host_stops_the_rollout_and_leaves_the_third_untouched(three_hosts):
    third = unit_props("lab3")
    proc = rollout("--canary", "1", "--wave", "1", overrides={
        "lab2": {"model": {"path": None, "host_path": "/var/lib/vllm/models/not-there"}}})
    print(proc.stdout)
    assert proc.returncode != 0
    assert "rollout STOPPED at wave 2" in proc.stdout
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.split() and line.split()[0] in HOSTS and len(line.split()) > 3}
    assert rows["lab1"][2] == "updated" or rows["lab1"][2] == "unchanged"
    assert rows["lab2"][2:4] == ["rolled", "back"]
    assert rows["lab3"][2] == "untouched"
    assert unit_props("lab3") == third  # same MainPID, never restarted
    assert "/var/lib/vllm/models/tiny-llama" in on("lab2", "cat /etc/vllm/default.yaml")


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
