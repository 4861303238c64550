"""The smoke test's four requests are independent, so they are sent at once: the test then takes its
slowest check's time (the completion), not the sum. Proved with a barrier every request must reach
before any is answered, over httpx's in-process transport (no server: these are the HTTP layer's
decisions)."""

from __future__ import annotations

import json
import threading

import httpx

from vllm_fleet.controller.smoke import run_checks

URL = "http://vllm.test"


def _answer(request: httpx.Request) -> httpx.Response:
    keyed = request.headers.get("authorization") == "Bearer k"
    if request.url.path == "/health":
        return httpx.Response(200)
    if request.url.path == "/v1/models":
        return (httpx.Response(200, json={"data": [{"id": "tiny"}]}) if keyed
                else httpx.Response(401))
    body = json.loads(request.content)
    return httpx.Response(200, json={"usage": {"completion_tokens": body["max_tokens"]}})


def test_the_checks_are_in_flight_together_and_reported_in_order() -> None:
    together = threading.Barrier(4, timeout=10)  # a check sent after another's answer breaks it

    def handler(request: httpx.Request) -> httpx.Response:
        together.wait()
        return _answer(request)

    checks = run_checks(URL, "tiny", "k", transport=httpx.MockTransport(handler))
    assert [(c.name, c.ok) for c in checks] == [
        ("health", True), ("models", True), ("completion", True), ("no-key-401", True)]
    assert not together.broken


def test_a_check_whose_request_fails_is_named_as_its_result_is() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if "authorization" not in request.headers and request.url.path == "/v1/models":
            raise httpx.ConnectError("channel refused", request=request)
        return _answer(request)

    checks = run_checks(URL, "tiny", "k", transport=httpx.MockTransport(handler))
    failed = [(c.name, c.detail) for c in checks if not c.ok]
    assert failed == [("no-key-401", "ConnectError: channel refused")]


def test_without_a_key_there_is_no_401_check() -> None:
    checks = run_checks(URL, "tiny", None, transport=httpx.MockTransport(_answer))
    assert [c.name for c in checks] == ["health", "models", "completion"]
    assert not checks[1].ok  # the mock's /v1/models wants the key: the check says what it got


def test_the_routes_without_the_key_go_out_together_after_the_sentinel_alone() -> None:
    """The 401 sweep: /invocations first and alone (an unguarded server gets nothing more), then the
    other routes several at a time (a barrier of GUARD_CONCURRENCY that sequential requests never fill)."""
    from vllm_fleet.controller.smoke import GUARD_CONCURRENCY, SENTINEL, guard_check

    routes = [{"path": SENTINEL, "methods": ["POST"]}] + [
        {"path": f"/r{i}", "methods": ["GET"]} for i in range(2 * GUARD_CONCURRENCY)]
    order: list[str] = []
    together = threading.Barrier(GUARD_CONCURRENCY, timeout=10)

    def handler(request: httpx.Request) -> httpx.Response:
        order.append(request.url.path)
        if request.url.path != SENTINEL:
            together.wait()
        return httpx.Response(401)

    c = guard_check(URL, routes, {"/health"}, transport=httpx.MockTransport(handler))
    assert c.ok and c.detail == f"401 on {len(routes)}/{len(routes)} routes", c.detail
    assert order[0] == SENTINEL and sorted(order[1:]) == sorted(r["path"] for r in routes[1:])
    assert not together.broken


def test_a_started_unit_counts_as_crashed_as_soon_as_its_process_exited() -> None:
    """systemctl show of the unit the deploy started, as systemd words each state: a process that
    exited is waiting out RestartSec= (auto-restart, NRestarts still 0) before anything else shows it."""
    from vllm_fleet.controller.smoke import crashed

    assert not crashed({"ActiveState": "activating", "SubState": "start", "NRestarts": "0"})
    assert not crashed({"ActiveState": "active", "SubState": "running", "NRestarts": "0"})
    assert crashed({"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "0"})
    assert crashed({"ActiveState": "active", "SubState": "running", "NRestarts": "1"})
    for waiting in ("auto-restart-queued", "dead-before-auto-restart", "failed-before-auto-restart"):
        assert crashed({"ActiveState": "activating", "SubState": waiting, "NRestarts": "0"})
    assert crashed({"ActiveState": "failed", "SubState": "failed", "NRestarts": "0"})


def test_a_settled_instances_first_round_stands_only_on_a_passing_health_check() -> None:
    """A round that stopped at the listener check sent no /health: nothing listened yet, perhaps a
    restart under way, so the bounded wait for /health follows instead of a failed result."""
    from vllm_fleet.controller.smoke import Check, stands

    assert not stands([Check("listener", False, "nothing listens on port 8000: the key was not sent")])
    assert not stands([Check("health", False, "ConnectError: refused"), Check("models", False, "x")])
    assert stands([Check("health", True, "HTTP 200"), Check("models", False, "serves []")])
    assert not stands([])
