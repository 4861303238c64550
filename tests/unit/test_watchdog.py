"""The watchdog's decision and its units, without a host (the lab test freezes a real engine)."""

from __future__ import annotations

import pytest

from fleetlab.inventory import lab_vllm
from vllm_fleet.core import render
from vllm_fleet.core.plan import HostFacts, plan_host
from vllm_fleet.core.spec import SpecError, parse_host
from vllm_fleet.host.watchdog import RESTART, State, Unit, decide, serve_target

UNIT = Unit("inv-1", active=True, started=1000.0)
KEY = "key-that-must-stay-in-the-env-file"
LIMITS = {"failures": 3, "window_s": 180.0, "grace_s": 420.0}


def run(state: State, results: list[tuple[bool, float]], unit: Unit = UNIT) -> list[tuple[str, bool]]:
    out = []
    for ok, now in results:
        state, note, restart = decide(state, unit, ok, "" if ok else "timed out", now, **LIMITS)
        out.append((note, restart))
    return out


def test_three_failures_in_a_row_after_serving_restart():
    steps = run(State(), [(True, 1010), (False, 1100), (False, 1160), (False, 1220)])
    assert steps[0] == ("serving", False)
    assert [r for _, r in steps] == [False, False, False, True]
    assert "3 probes failed in a row (last: timed out): restarting" in steps[-1][0]


def test_a_success_in_between_resets_the_count():
    steps = run(State(), [(True, 1010), (False, 1100), (False, 1160), (True, 1200), (False, 1260),
                          (False, 1320)])
    assert not any(r for _, r in steps)


def test_failures_older_than_the_bound_are_forgotten():
    steps = run(State(), [(True, 1010), (False, 1100), (False, 1200), (False, 1400)])
    assert not any(r for _, r in steps)
    assert steps[-1][0].endswith("1 of 3 in a row")  # both earlier ones are over 180 s old


def test_an_instance_still_loading_is_left_alone_until_the_start_timeout():
    """Never served since it started: failures do not count before ready_timeout_s (a big model loads)."""
    steps = run(State(), [(False, 1030), (False, 1100), (False, 1200), (False, 1300)])
    assert not any(r for _, r in steps)
    assert "waiting up to 420 s" in steps[0][0]
    later = run(State(), [(False, 1430), (False, 1490), (False, 1550)])
    assert [r for _, r in later] == [False, False, True]


def test_a_new_invocation_starts_over():
    """The deploy (or the watchdog itself) restarted the unit: old failures and 'served' are void."""
    state, _, _ = decide(State(), UNIT, True, "", 1010, **LIMITS)
    for now in (1100, 1160):
        state, _, _ = decide(state, UNIT, False, "x", now, **LIMITS)
    restarted = Unit("inv-2", active=True, started=1200.0)
    state, note, restart = decide(state, restarted, False, "connection refused", 1230, **LIMITS)
    assert not restart and "not serving yet" in note and state.failures == [] and not state.armed


def test_an_inactive_unit_is_not_probed_nor_restarted():
    """Stopped by an operator or failed: systemd's own Restart= and the deploy decide, not the watchdog."""
    stopped = Unit("inv-1", active=False, started=1000.0)
    state, note, restart = decide(State("inv-1", True, [1100.0, 1160.0]), stopped, None, "", 1220, **LIMITS)
    assert (note, restart, state.failures) == ("", False, [])


def test_state_survives_a_round_trip_and_garbage_reads_as_fresh():
    s = State("inv-1", True, [1.5, 2.5], "timed out")
    assert State.load(s.dump()) == s
    assert State.load("not json") == State() and State.load('{"armed": 1}') == State()


def test_unit_state_is_read_from_systemctl_show():
    text = "InvocationID=0f3a\nActiveState=active\nActiveEnterTimestampMonotonic=123456789\n"
    assert Unit.parse(text) == Unit("0f3a", True, 123.456789)
    assert Unit.parse("ActiveState=inactive\nActiveEnterTimestampMonotonic=\n") == Unit("", False, 0.0)


def test_the_probe_reads_address_port_and_name_from_the_live_config():
    """A rollback may put back a config with another port or name: the probe follows the file."""
    rendered = render.serve_config(*_lab_plan())
    assert serve_target(rendered) == ("127.0.0.1", 8000, "tiny-llama")
    wildcard = "host: 0.0.0.0\nport: 8001\nserved-model-name: 'chat'\n"
    assert serve_target(wildcard) == ("127.0.0.1", 8001, "chat")
    assert serve_target("host: 10.77.1.2\nport: 9000\n") == ("10.77.1.2", 9000, None)


def _lab_plan(overrides: dict | None = None):
    plan = plan_host("lab1", parse_host("lab1", {**lab_vllm(1), **(overrides or {})}), HostFacts(),
                     {"VLLM_API_KEY": KEY})
    return plan, plan.instances[0]


def test_units_render_the_inventory_settings_and_restart_only_on_the_probe_status():
    plan, inst = _lab_plan({"watchdog": {"interval_s": 5, "timeout_s": 4, "failures": 2}})
    service, timer = render.watchdog_units(inst)
    assert inst.watchdog is not None and inst.watchdog.bound_s == 18
    assert "--timeout 4 --failures 2 --window 46 --grace 420" in service
    assert f"SuccessExitStatus={RESTART}" in service
    assert f'[ "$$EXIT_STATUS" = {RESTART} ] || exit 0' in service
    assert "exec systemctl --no-block restart vllm-default.service" in service
    assert "DynamicUser=yes" in service and "EnvironmentFile=/etc/vllm/default.env" in service
    assert "OnUnitInactiveSec=5" in timer
    assert KEY not in service + timer  # the probe gets it from the env file


def test_turned_off_and_cluster_workers_have_no_watchdog():
    _, inst = _lab_plan({"watchdog": {"enabled": False}})
    assert inst.watchdog is None


@pytest.mark.parametrize("bad, words", [
    ({"interval_s": 0}, "watchdog.interval_s"),
    ({"failures": "3"}, "watchdog.failures"),
    ({"retries": 3}, "watchdog.retries"),
])
def test_bad_watchdog_settings_name_host_and_field(bad, words):
    with pytest.raises(SpecError) as e:
        parse_host("lab1", {**lab_vllm(1), "watchdog": bad})
    assert any(p.startswith("lab1: ") and words in p for p in e.value.problems), e.value.problems


def test_a_busy_engine_is_not_a_hung_one():
    """The probe failed in a full queue while the engine's token counters moved: not counted; a frozen
    engine's counters stand still (seen on the lab's SIGSTOPped engine), so it is."""
    state, _, _ = decide(State(), UNIT, True, "", 1010, **LIMITS)
    for now in (1100, 1160, 1220):
        state, note, restart = decide(state, UNIT, False, "late", now, busy=1200.0, **LIMITS)
        assert not restart and "busy, not hung" in note
    for now in (1280, 1340, 1400):
        state, note, restart = decide(state, UNIT, False, "late", now, **LIMITS)
    assert restart


def test_a_broken_or_hostile_answer_is_a_failed_probe_not_a_crash():
    import socket
    import threading

    from vllm_fleet.host.watchdog import probe

    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]", b"garbage\r\n\r\n",
               b"HTTP/1.1 302 Found\r\nLocation: http://example.invalid/\r\nContent-Length: 0\r\n\r\n"]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        for answer in answers:
            conn, _ = srv.accept()
            conn.recv(65536)
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    results = [probe(url, "m", "key", 5) for _ in answers]
    srv.close()
    assert [ok for ok, _ in results] == [False, False, False]
    assert results[0][1] == "an answer that is not a completion"
    assert results[2][1] == "HTTP 302 on POST /v1/completions"  # not followed: the key stays here


def test_the_probe_may_reach_loopback_and_the_hosts_own_addresses_only():
    from vllm_fleet.core.environment import watchdog_of
    from vllm_fleet.core.spec import InstanceSpec

    inst = InstanceSpec.model_validate({"model": {"name": "m", "path": "/m"}})
    w = watchdog_of(inst, 600, "vllm-node.example", {"10.0.0.7": "eth0", "127.0.0.1": "lo"}, None)
    assert w is not None and w.allow == ("localhost", "10.0.0.7")
    w = watchdog_of(inst, 600, "10.0.0.9", {}, None)
    assert w is not None and w.allow == ("localhost", "10.0.0.9")


def test_the_probe_sends_no_key_while_another_process_holds_the_port(tmp_path, capsys):
    """A real listener on this machine stands for a local user who took the port during a restart: the
    root part of the unit lists it (its cgroup is not the instance's), and the probe then connects to
    nothing and counts nothing."""
    import os
    import socket
    import subprocess

    from vllm_fleet.host.watchdog import holders_command, main

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    listed = subprocess.run(["sh", "-c", holders_command(port, "vllm-default.service").replace("$$", "$")],
                            capture_output=True, text=True, timeout=30).stdout
    if "no ss" in listed:
        pytest.skip("ss (iproute2) is not installed here")
    assert f"(pid {os.getpid()})" in listed, listed
    (tmp_path / "config.yaml").write_text(f"host: 127.0.0.1\nport: {port}\nserved-model-name: m\n")
    (tmp_path / "unit").write_text("InvocationID=inv-1\nActiveState=active\n"
                                   "ActiveEnterTimestampMonotonic=1\n")
    (tmp_path / "holders").write_text(listed)
    rc = main(["--config", str(tmp_path / "config.yaml"), "--unit", "vllm-default.service",
               "--unit-state", str(tmp_path / "unit"), "--holders", str(tmp_path / "holders"),
               "--state", str(tmp_path / "state.json"), "--timeout", "2", "--failures", "1",
               "--window", "60", "--grace", "0"])
    with pytest.raises(TimeoutError):
        srv.accept()  # nothing connected: no request, so no key
    srv.close()
    assert rc == 0
    assert "not probed: its port is held by" in capsys.readouterr().out
