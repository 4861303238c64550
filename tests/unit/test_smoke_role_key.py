"""roles/smoke.py check(): after the holder check refuses, no request with the key goes out, the live
/metrics reads of `vllm-fleet status` included. The tunnel and the host's listeners are replaced here (a
port taken between the plan's read and the check is a race the lab cannot stage on demand: the plan
itself refuses a port held when it reads the host); every request is recorded by httpx's MockTransport."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import httpx
import pytest
from pyinfra.context import ctx_host

import vllm_fleet.roles.smoke as smoke_role

SQUATTER = {"address": "127.0.0.1", "port": 8000, "process": "python3", "pid": 4242,
            "unit": "squatter.service"}


@pytest.mark.parametrize("wait", [False, True])
def test_a_refused_holder_check_sends_nothing_with_the_key(monkeypatch: pytest.MonkeyPatch,
                                                            wait: bool) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, text="ok")

    @contextlib.contextmanager
    def tunnel(_host, _addr, _port):  # type: ignore[no-untyped-def]
        yield SimpleNamespace(url="http://tunnel", transport=httpx.MockTransport(handler))

    monkeypatch.setattr(smoke_role, "tunnel", tunnel)
    monkeypatch.setattr(smoke_role, "port_listeners", lambda: [SQUATTER])
    monkeypatch.setattr(smoke_role, "_unit_crashed", lambda unit: False)
    monkeypatch.setenv("SMOKE_TEST_KEY", "sekrit-key-value")
    target = smoke_role.Target("default", "tiny", "127.0.0.1", 8000, "SMOKE_TEST_KEY")
    with ctx_host.use(SimpleNamespace(name="lab1")):
        result = smoke_role.check(target, "0.32.0-cpu", 5.0, wait=wait, live=True, settled=wait)
    assert [c.name for c in result.checks] == ["listener"] and not result.ok, result.checks
    assert "held by python3 (pid 4242, squatter.service)" in result.checks[0].detail
    assert result.live is None
    assert not [r for r in sent if "authorization" in r.headers], [r.url for r in sent]
