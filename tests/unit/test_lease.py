"""The host lease (vllm_fleet/host/lease.py) against a temporary root: one holder at a time, a second
that waits and is refused naming the holder, expiry of a holder whose controller went silent or away,
and the host commands (hoststate.py) that refuse to write under another run's lease."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "vllm_fleet/host/lease.py")
HOLDER = {"controller": "ctl-a", "login": "deploy", "pid": 4242, "command": "deploy: pyinfra inv.py vllm.py"}


@pytest.fixture
def lease(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_ROOT", str(tmp_path))
    import vllm_fleet.host.lease as mod

    yield importlib.reload(mod)
    monkeypatch.delenv("VLLM_FLEET_ROOT")
    importlib.reload(mod)


def test_one_holder_at_a_time_and_a_dead_ones_lease_is_taken_over_after_its_ttl(lease):
    assert lease.take("a", HOLDER, ttl=30, now=1000) == (True, "held")
    ok, who = lease.take("b", {**HOLDER, "controller": "ctl-b"}, ttl=30, now=1010)
    assert not ok and who.startswith("deploy: pyinfra inv.py vllm.py by deploy@ctl-a (pid 4242), since ")
    assert lease.take("a", HOLDER, ttl=30, now=1020)[0]  # its own holder again: renewed, same start
    ok, said = lease.take("b", HOLDER, ttl=30, now=1051)
    assert ok and said.startswith("took over the expired lease of deploy: pyinfra")
    assert "not renewed for 31 s (its controller died or lost its connection)" in said
    assert lease.read()["token"] == "b"
    assert not lease.release("a") and lease.release("b") and lease.read() is None
    assert oct(os.stat(lease.GUARD).st_mode & 0o777) == "0o600"


def _hold(root: Path, token: str, wait: float, ttl: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SCRIPT, "hold", token, json.dumps({**HOLDER, "pid": token}),
                             str(wait), str(ttl)], env={**os.environ, "VLLM_FLEET_ROOT": str(root)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_second_run_waits_then_is_refused_naming_the_holder_and_a_release_lets_the_next_in(tmp_path):
    first = _hold(tmp_path, "one", wait=5, ttl=30)
    assert first.stdout.readline().strip() == "held"
    first.stdin.write("check\n")  # what a run asks before it executes (roles/lease.py)
    first.stdin.flush()
    assert first.stdout.readline().strip() == "ok"
    second = _hold(tmp_path, "two", wait=1, ttl=30)
    out, _ = second.communicate(timeout=10)
    assert second.returncode == 3
    assert out.splitlines()[0].startswith("waiting: the host lease is held by deploy: pyinfra inv.py")
    assert "refused: the host lease is held by " in out and "(pid one)" in out and "waited 1 s" in out
    third = _hold(tmp_path, "three", wait=10, ttl=30)
    assert third.stdout.readline().startswith("waiting: ")
    first.stdin.write("release\n")
    first.stdin.flush()
    assert first.stdout.readline().strip() == "released"
    assert third.stdout.readline().strip() == "held"  # the waiter gets it as soon as it is given back
    third.stdin.close()  # the channel closes without a release: the lease stays until it expires
    third.wait(timeout=5)
    data = json.loads(subprocess.run([sys.executable, SCRIPT, "show"], capture_output=True, text=True,
                                     env={**os.environ, "VLLM_FLEET_ROOT": str(tmp_path)}).stdout)
    assert data["live"] and data["lease"]["token"] == "three"


def test_a_holder_without_heartbeats_stops_and_its_lease_expires(tmp_path):
    held = _hold(tmp_path, "quiet", wait=1, ttl=1)
    assert held.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    held.wait(timeout=5)  # no "beat" within the ttl: the controller is gone as far as the host knows
    assert time.monotonic() - t0 < 3
    nxt = _hold(tmp_path, "next", wait=3, ttl=30)
    line = nxt.stdout.readline()
    assert held.returncode == 0  # the quiet one is gone: a run that paused that long finds its channel
    # closed at its check (roles/lease.py confirm_op) and changes nothing
    assert line.startswith("took over the expired lease of deploy: pyinfra inv.py vllm.py by deploy@ctl-a")
    nxt.stdin.write("beat\nrelease\n")
    nxt.stdin.flush()
    assert nxt.stdout.readline().strip() == "released"


def test_hoststate_refuses_to_write_under_another_runs_lease(tmp_path):
    env = {**os.environ, "VLLM_FLEET_ROOT": str(tmp_path)}
    held = _hold(tmp_path, "owner", wait=1, ttl=30)
    assert held.stdout.readline().strip() == "held"
    hs = str(REPO / "vllm_fleet/host/hoststate.py")
    for argv in (["commit", "0.32.0-cpu"], ["--lease", "intruder", "restore", "previous"]):
        out = subprocess.run([sys.executable, hs, *argv], capture_output=True, text=True, env=env)
        assert out.returncode == 1
        assert "the host lease is held by deploy: pyinfra inv.py vllm.py" in out.stderr
        assert "belongs to no run that holds it, nothing was changed" in out.stderr
    mine = subprocess.run([sys.executable, hs, "--lease", "owner", "prune", "2"], capture_output=True,
                          text=True, env=env)
    assert mine.returncode == 0, mine.stderr
    busy = subprocess.run([sys.executable, SCRIPT, "busy"], capture_output=True, text=True, env=env)
    assert busy.returncode == 0 and "not restarting: a vllm-fleet run holds the host lease" in busy.stdout
    held.stdin.write("release\n")
    held.stdin.flush()
    held.wait(timeout=5)
    assert subprocess.run([sys.executable, SCRIPT, "busy"], env=env).returncode == 1

