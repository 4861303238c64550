"""vllm_fleet/host/keyguard.py driven in-process with a tiny ASGI app: what passes, what gets 401, and how."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vllm_fleet.host import keyguard
from vllm_fleet.host.keyguard import KeyGuard, open_paths, route_path

KEY = "s3cret-key"


async def _inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await send({"type": "lifespan.startup.complete"})
        return
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ran"})


def _call(guard: KeyGuard, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent


def _http(path: str, method: str = "POST", auth: str | None = None, **extra: Any) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if auth is not None:
        headers.append((b"authorization", auth.encode()))
    headers += [(k.encode(), v.encode()) for k, v in extra.pop("headers", {}).items()]
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers, **extra}


def _status(sent: list[dict[str, Any]]) -> int:
    return sent[0]["status"]


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> KeyGuard:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.delenv(keyguard.OPEN_ENV, raising=False)
    return KeyGuard(_inner)


def test_health_is_open_by_default_and_nothing_else(guard: KeyGuard) -> None:
    assert _status(_call(guard, _http("/health", "GET"))) == 200
    for path in ("/invocations", "/scale_elastic_ep", "/v1/completions", "/metrics", "/ping", "/health/",
                 "/healthz", "/v1/models", "/openapi.json", "/anything-unregistered"):
        sent = _call(guard, _http(path))
        assert _status(sent) == 401, path
        assert sent[1]["body"] == b'{"error":"Unauthorized"}'


def test_the_key_passes_every_route(guard: KeyGuard) -> None:
    for path in ("/invocations", "/scale_elastic_ep", "/metrics"):
        assert _status(_call(guard, _http(path, auth=f"Bearer {KEY}"))) == 200
    assert _status(_call(guard, _http("/invocations", auth=f"bearer {KEY}"))) == 200


@pytest.mark.parametrize("auth", ["", "Bearer", "Bearer ", "Bearer wrong", f"Basic {KEY}", KEY,
                                  f"Bearer {KEY} ", f"Bearer {KEY}x", f"Token {KEY}"])
def test_wrong_key_or_scheme_is_401(guard: KeyGuard, auth: str) -> None:
    assert _status(_call(guard, _http("/invocations", auth=auth))) == 401


def test_metrics_opens_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv(keyguard.OPEN_ENV, "/health,/metrics")
    g = KeyGuard(_inner)
    assert _status(_call(g, _http("/metrics", "GET"))) == 200
    # vLLM's /metrics mount matches any suffix; only the exact path is open
    assert _status(_call(g, _http("/metrics/x", "GET"))) == 401
    assert _status(_call(g, _http("/metricsx", "GET"))) == 401


def test_root_path_is_stripped_as_the_router_strips_it(guard: KeyGuard) -> None:
    assert _status(_call(guard, _http("/api/health", "GET", root_path="/api"))) == 200
    assert _status(_call(guard, _http("/api/invocations", root_path="/api"))) == 401
    assert route_path({"path": "/apiv/health", "root_path": "/api"}) == "/apiv/health"


def test_cors_preflight_passes_but_a_bare_options_does_not(guard: KeyGuard) -> None:
    pre = {"origin": "https://app.example", "access-control-request-method": "POST"}
    assert _status(_call(guard, _http("/invocations", "OPTIONS", headers=pre))) == 200
    assert _status(_call(guard, _http("/invocations", "OPTIONS"))) == 401
    assert _status(_call(guard, _http("/invocations", "POST", headers=pre))) == 401


def test_websocket_is_refused_without_the_key(guard: KeyGuard) -> None:
    ws = {"type": "websocket", "path": "/v1/realtime", "root_path": "", "headers": []}
    assert _call(guard, ws) == [{"type": "websocket.close", "code": 1008}]
    sent = _call(guard, {**ws, "extensions": {"websocket.http.response": {}}})
    assert sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 401
    ok = {**ws, "headers": [(b"authorization", f"Bearer {KEY}".encode())]}
    assert _call(guard, ok) == [{"type": "websocket.accept"}]


def test_lifespan_passes(guard: KeyGuard) -> None:
    assert _call(guard, {"type": "lifespan"}) == [{"type": "lifespan.startup.complete"}]


def test_no_key_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "")
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        KeyGuard(_inner)
    monkeypatch.delenv("VLLM_API_KEY")
    with pytest.raises(RuntimeError):
        KeyGuard(_inner)


def test_open_paths_env() -> None:
    assert open_paths({}) == {"/health"}
    assert open_paths({keyguard.OPEN_ENV: "/health, /metrics,"}) == {"/health", "/metrics"}
    assert open_paths({keyguard.OPEN_ENV: ""}) == frozenset()


def test_host_file_is_stdlib_only() -> None:
    import ast
    from pathlib import Path

    tree = ast.parse(Path(keyguard.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top <= {"__future__", "hashlib", "hmac", "json", "os", "sys", "collections", "typing"}


# --- the plan, the inventory and the smoke test's probes -------------------------------------------------
def _plan(inst: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    from vllm_fleet.core.plan import HostFacts, plan_host
    from vllm_fleet.core.spec import parse_host

    data = {"accelerator": "cpu", "model": {"name": "tiny", "host_path": "/opt/models/tiny"}, **inst}
    return plan_host("h", parse_host("h", data), HostFacts(), {"VLLM_API_KEY": KEY} if environ is None
                     else environ).instances[0]


def test_an_instance_with_a_key_loads_the_guard_with_its_open_paths() -> None:
    inst = _plan({"open_paths": ["/health", "/metrics"]})
    assert inst.flags["middleware"] == "vllm_fleet_keyguard.KeyGuard"
    assert inst.environment["PYTHONPATH"] == "/usr/local/lib/vllm-fleet/asgi"
    assert inst.environment["VLLM_FLEET_OPEN_PATHS"] == "/health,/metrics"


def test_an_instance_without_a_key_gets_no_guard() -> None:
    inst = _plan({"api_key_env": None}, environ={})
    assert "middleware" not in inst.flags
    assert "PYTHONPATH" not in inst.environment and keyguard.OPEN_ENV not in inst.environment


@pytest.mark.parametrize("paths, why", [(["/health", "/invocations"], "'/invocations' cannot be opened"),
                                        (["/metrics"], "'/health' must stay open"),
                                        (["/health", "/v1/completions"], "cannot be opened")])
def test_open_paths_refuse_what_runs_the_model(paths: list[str], why: str) -> None:
    from vllm_fleet.core.spec import SpecError

    with pytest.raises(SpecError) as e:
        _plan({"open_paths": paths})
    assert why in " ".join(e.value.problems)


@pytest.mark.parametrize("where", [{"extra_args": {"middleware": "evil.App"}},
                                   {"extra_args": {"--middleware": ["evil.App"]}},
                                   {"middleware": "evil.App"}])
def test_the_inventory_cannot_set_or_override_the_middleware(where: dict[str, Any]) -> None:
    from vllm_fleet.core.spec import SpecError

    with pytest.raises(SpecError) as e:
        _plan({"flags": where})
    assert "set by vllm-fleet" in " ".join(e.value.problems)


@pytest.mark.parametrize("key", ["PYTHONPATH", "VLLM_FLEET_OPEN_PATHS"])
def test_the_guards_environment_is_reserved(key: str) -> None:
    from vllm_fleet.core.spec import SpecError

    with pytest.raises(SpecError):
        _plan({"env": {key: "/tmp"}})


ROUTES = [{"kind": "http", "path": "/health", "methods": ["GET"]},
          {"kind": "http", "path": "/v1/models", "methods": ["GET"]},
          {"kind": "http", "path": "/v1/responses/{response_id}", "methods": ["GET"]},
          {"kind": "http", "path": "/invocations", "methods": ["POST"]},
          {"kind": "http", "path": "/ping", "methods": ["GET", "POST"]},
          {"kind": "mount", "path": "/metrics", "methods": []},
          {"kind": "websocket", "path": "/v1/realtime", "methods": []}]


def test_probes_cover_every_route_but_the_open_ones_invocations_first() -> None:
    from vllm_fleet.controller.smoke import probes

    assert probes(ROUTES, {"/health", "/metrics"}) == [
        ("http", "POST", "/invocations"), ("http", "GET", "/v1/models"),
        ("http", "GET", "/v1/responses/smoke"), ("http", "POST", "/ping"),
        ("http", "GET", "/metrics/smoke"), ("websocket", "GET", "/v1/realtime")]
    assert ("http", "GET", "/metrics") in probes(ROUTES, {"/health"})


def _transport(app: Any) -> Any:
    """httpx's sync client on the ASGI app in-process: each request becomes one ASGI call, one at a
    time (the checks send concurrently; under pyinfra's gevent patching the threads are greenlets of one
    thread, where two asyncio.run calls would meet)."""
    import threading

    import httpx

    one = threading.Lock()

    def handle(request: httpx.Request) -> httpx.Response:
        upgrade = request.headers.get("upgrade", "").lower() == "websocket"
        scope = {"type": "websocket" if upgrade else "http", "method": request.method,
                 "path": request.url.path, "root_path": "", "headers": request.headers.raw}
        with one:
            sent = _call(app, scope)
        if sent[0]["type"] == "websocket.close":
            return httpx.Response(403)
        if sent[0]["type"] == "websocket.accept":
            return httpx.Response(101)
        return httpx.Response(sent[0]["status"], content=sent[1]["body"])

    return httpx.MockTransport(handle)


def test_guard_check_through_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_fleet.controller.smoke import guard_check

    monkeypatch.setenv("VLLM_API_KEY", KEY)
    monkeypatch.setenv(keyguard.OPEN_ENV, "/health,/metrics")
    tr = _transport(KeyGuard(_inner))
    ok = guard_check("http://vllm", ROUTES, {"/health", "/metrics"}, transport=tr)
    assert ok.ok and ok.detail == "401 on 6/6 routes", ok.detail
    # a route the server opens that the smoke test was not told is open
    bad = guard_check("http://vllm", ROUTES, {"/health"}, transport=tr)
    assert not bad.ok and "GET /metrics: HTTP 200" in bad.detail
    none = guard_check("http://vllm", ROUTES[:2], {"/health"}, transport=tr)
    assert not none.ok and "no /invocations" in none.detail


def test_an_unguarded_server_gets_nothing_after_invocations() -> None:
    from vllm_fleet.controller.smoke import guard_check

    seen: list[str] = []

    async def open_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await _inner(scope, receive, send)

    c = guard_check("http://vllm", ROUTES, {"/health"}, transport=_transport(open_app))
    assert not c.ok and "POST /invocations: HTTP 200 without the key" in c.detail
    assert seen == ["/invocations"]


def test_the_smoke_table_shows_the_route_count() -> None:
    from vllm_fleet.controller.smoke import Check, SmokeResult, table

    r = SmokeResult("h", "default", "tiny", 1, "0.32.0-cpu",
                    [Check("health", True), Check("no-key-401", True, "401 on 40/40 routes")])
    assert "ok (401 on 40/40 routes)" in table([r])
