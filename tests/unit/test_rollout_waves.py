"""Wave planning of `vllm-fleet rollout` (pure): canary first, inventory order, never above the cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_fleet.controller.rollout import HostOutcome, RolloutResult, waves

HOSTS = ["h1", "h2", "h3", "h4", "h5", "h6", "h7"]


def test_canary_then_fixed_waves():
    assert waves(HOSTS, 1, "2") == [["h1"], ["h2", "h3"], ["h4", "h5"], ["h6", "h7"]]


def test_percentage_waves_round_up():
    assert waves(HOSTS, 1, "50%") == [["h1"], ["h2", "h3", "h4", "h5"], ["h6", "h7"]]


def test_no_canary_and_max_unavailable_caps_both():
    assert waves(HOSTS[:3], 0, "1") == [["h1"], ["h2"], ["h3"]]
    assert waves(HOSTS[:6], 3, "3", max_unavailable=2) == [["h1", "h2"], ["h3", "h4"], ["h5", "h6"]]


@pytest.mark.parametrize("bad", ["0", "-1", "x", "10%%", ""])
def test_bad_wave_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="--wave"):
        waves(HOSTS, 1, bad)


@given(st.integers(1, 40), st.integers(0, 5), st.integers(1, 10), st.one_of(st.none(), st.integers(1, 6)))
def test_every_host_once_in_order_and_no_wave_above_the_cap(n, canary, size, cap):
    hosts = [f"h{i}" for i in range(n)]
    plan = waves(hosts, canary, str(size), cap)
    assert [h for w in plan for h in w] == hosts
    assert all(len(w) <= (cap or max(size, canary)) for w in plan)


def test_the_table_names_hosts_per_outcome_and_the_stop():
    hosts = {"a": HostOutcome("a", 1, "updated", "0.32.0-cpu", "1", 61.0, 90.0),
             "b": HostOutcome("b", 2, "rolled back", detail="b: model"),
             "c": HostOutcome("c", 3)}
    r = RolloutResult([["a"], ["b"], ["c"]], hosts, stopped_at=2, seconds=200)
    text = r.table()
    assert "updated: a" in text and "rolled back: b" in text and "untouched: c" in text
    assert "rollout STOPPED at wave 2: later waves were not touched; left as they were: c (200 s)" in text
    assert text.splitlines()[1].split() == ["a", "1", "updated", "0.32.0-cpu", "1", "61", "ms", "90", "s"]


def test_inventory_order_is_read_by_pyinfra_itself(tmp_path):
    from vllm_fleet.controller.rollout import inventory_hosts

    inv = tmp_path / "inv.py"
    inv.write_text('web = [("c-host", {"vllm": {}}), ("a-host", {"vllm": {"x": 1}})]\n'
                   'gpu = [("b-host", {"vllm": {"model": {"name": "m"}}})]\n')
    assert inventory_hosts(str(inv)) == (["c-host", "a-host", "b-host"], [])
    assert inventory_hosts(str(inv), "b-host,c-host") == (["c-host", "b-host"], [])
    with pytest.raises(RuntimeError, match="not in the inventory: nope"):
        inventory_hosts(str(inv), "nope")


def test_hosts_without_vllm_data_are_skipped_and_named(tmp_path):
    """A mixed inventory: the database and the load balancer are not rolled out, and are named."""
    from vllm_fleet.controller.rollout import inventory_hosts

    inv = tmp_path / "inv.py"
    inv.write_text('db = [("db-01", {"ssh_user": "deploy"})]\nlb = ["lb-01"]\n'
                   'gpu = [("gpu-01", {"vllm": {"model": {"name": "m"}}})]\n')
    assert inventory_hosts(str(inv)) == (["gpu-01"], ["db-01", "lb-01"])
    assert inventory_hosts(str(inv), "db-01") == ([], ["db-01"])


def test_each_host_is_classified_from_the_runs_record_not_its_printed_text():
    from vllm_fleet.controller.rollout import _classify

    ok = {"host": "a", "ok": True, "changed": True, "note": ""}

    def seen(connected: bool, failed: bool, reason: str = "") -> dict:
        return {"connected": connected, "failed": failed, "reason": reason}

    outcome = {"hosts": {"a": seen(True, False),
                         "b": seen(True, True, "b: change failed and was rolled back"),
                         "c": seen(False, False), "d": seen(True, True, "d: refused, nothing was changed"),
                         "e": seen(True, False), "f": seen(True, True)},
               "smoke": [ok, {"host": "b", "ok": False, "changed": True, "note": "rolled back to 0.31.0-cpu"},
                         {"host": "e", "ok": True, "changed": False, "note": ""}]}
    assert _classify("a", outcome) == ("updated", "")
    assert _classify("b", outcome) == ("rolled back", "change failed and was rolled back")
    assert _classify("c", outcome) == ("unreachable", "could not connect over SSH")
    assert _classify("d", outcome) == ("failed", "refused, nothing was changed")
    assert _classify("e", outcome) == ("unchanged", "")
    # pyinfra failed the host without the deploy saying why: the run's own error, else that it failed
    assert _classify("f", outcome, "No hosts remaining!") == ("failed", "No hosts remaining!")
    assert _classify("f", outcome) == ("failed", "pyinfra failed the host")
    # a run stopped by a refusal on another host: a host that looked fine did not finish
    assert _classify("e", outcome, "lab9: refused")[0] == "failed"


@pytest.fixture
def in_process(monkeypatch):
    """The runner puts pyinfra in CLI mode for the process (as pyinfra's CLI does); undone after the
    test, so the API-mode tests of this session see pyinfra as they expect."""
    import pyinfra
    from pyinfra import logger

    monkeypatch.setattr(pyinfra, "is_cli", pyinfra.is_cli)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(logger, "level", logger.level)


def test_a_run_where_no_host_connected_still_names_each_host_unreachable(tmp_path, in_process):
    """No deploy code ran (no host connected), so the deploy recorded nothing: pyinfra's State alone
    says which hosts did not connect. A real connection attempt to a closed local port."""
    import socket

    from vllm_fleet.controller import runner
    from vllm_fleet.controller.rollout import _classify, outcome_of
    from vllm_fleet.roles.vllm import deploy_vllm

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connection refused
    inv = tmp_path / "inv.py"
    inv.write_text(f'gpu = [("gone-01", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}, '
                   '"ssh_connect_retries": 0, "vllm": {"model": {"name": "m"}}})]\n')
    result = runner.run(runner.load_inventory(str(inv)), deploy_vllm, capture=True)
    assert not result.ok and result.error == "No hosts remaining!"
    assert _classify("gone-01", outcome_of(result), result.error) == ("unreachable",
                                                                       "could not connect over SSH")


def test_two_runs_in_one_process_keep_their_own_record_and_connections(tmp_path, in_process):
    """What a rollout does wave after wave: each run gets its own record on its own State, and ends with
    no host of the shared inventory still connected. pyinfra's @local connector: a real connection to
    this machine, no SSH."""
    from pyinfra import host
    from pyinfra.api import deploy
    from pyinfra.facts.server import Hostname

    from vllm_fleet.controller import runner
    from vllm_fleet.controller.run import current

    @deploy("probe")
    def probe() -> None:
        current().rows.setdefault("seen", []).append((host.name, host.get_fact(Hostname)))

    inv = tmp_path / "inv.py"
    inv.write_text('hosts = ["@local"]\n')
    inventory = runner.load_inventory(str(inv))
    first = runner.run(inventory, probe, capture=True)
    second = runner.run(inventory, probe, ["@local"], capture=True)
    assert first.ok and second.ok, first.output + second.output
    assert first.fleet is not None and second.fleet is not None and first.fleet is not second.fleet
    assert [name for name, _ in first.fleet.rows["seen"]] == ["@local"]
    assert [name for name, _ in second.fleet.rows["seen"]] == ["@local"]
    assert not any(h.connected for h in inventory)


def test_a_rollback_that_rolled_back_is_a_success_and_one_still_failing_is_not():
    """`vllm-fleet rollback` asks for exactly what a failed deploy's automatic rollback does: a host whose
    smoke test passes on the restored state is done, not failed; one whose restored state still fails
    is named as failed with the smoke test's words."""
    from vllm_fleet.controller.rollout import STOPS_ROLLBACK, STOPS_ROLLOUT, _classify

    outcome = {"hosts": {"a": {"connected": True, "failed": False, "reason": ""},
                         "b": {"connected": True, "failed": True, "reason": ""}},
               "smoke": [{"host": "a", "ok": True, "changed": True, "note": "rolled back to 0.31.0-cpu"},
                         {"host": "b", "ok": False, "changed": True,
                          "note": "rolled back to 0.31.0-cpu and STILL FAILING"}]}
    assert _classify("a", outcome) == ("rolled back", "rolled back to 0.31.0-cpu")
    assert _classify("b", outcome) == ("failed", "rolled back to 0.31.0-cpu and STILL FAILING")
    assert "rolled back" in STOPS_ROLLOUT and "rolled back" not in STOPS_ROLLBACK
    assert "failed" in STOPS_ROLLBACK


def test_a_stopped_rollback_names_the_hosts_it_left():
    hosts = {"a": HostOutcome("a", 1, "rolled back"),
             "b": HostOutcome("b", 2, "failed", detail="no previous"),
             "c": HostOutcome("c", 3)}
    r = RolloutResult([["a"], ["b"], ["c"]], hosts, stopped_at=2, seconds=30, what="rollback")
    text = r.table()
    assert "rollback STOPPED at wave 2: later waves were not touched; left as they were: c (30 s)" in text
    assert "b: no previous" in text
    done = RolloutResult([["a"]], {"a": hosts["a"]}, seconds=5, what="rollback")
    assert done.ok and done.table().endswith("rollback complete (5 s)")


def test_rollback_waves_go_on_past_hosts_that_rolled_back(monkeypatch, tmp_path):
    """The wave loop itself: a rollback over three hosts, each run recording a good rollback, runs every
    wave and ends ok (before, the first host's success stopped it with exit 1)."""
    from types import SimpleNamespace

    from vllm_fleet.controller import rollout

    inv = tmp_path / "inv.py"
    inv.write_text("gpu = [" + ", ".join(f'("{h}", {{"vllm": {{"model": {{"name": "m"}}}}}})'
                                         for h in "abc") + "]\n")
    ran: list[list[str]] = []

    def fake_run(inv, deploy, group, capture=True):
        ran.append(list(group))
        return SimpleNamespace(ok=True, error=None, output="", group=group)

    def fake_outcome(result):
        h = result.group[0]
        return {"hosts": {h: {"connected": True, "failed": False, "reason": ""}},
                "smoke": [{"host": h, "ok": True, "changed": True, "note": "rolled back to 0.31.0-cpu",
                           "release": "0.31.0-cpu", "tp": 1, "checks": []}]}

    monkeypatch.setattr(rollout.runner, "run", fake_run)
    monkeypatch.setattr(rollout, "outcome_of", fake_outcome)
    result = rollout.run(str(inv), deploy=lambda: None, canary=0, wave="1", log=lambda s: None,
                         what="rollback")
    assert ran == [["a"], ["b"], ["c"]]
    assert result.ok and [o.outcome for o in result.hosts.values()] == ["rolled back"] * 3
    stopped = rollout.run(str(inv), deploy=lambda: None, canary=0, wave="1", log=lambda s: None)
    assert stopped.stopped_at == 1  # the same record from a deploy is a failed change: it stops there
