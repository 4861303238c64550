"""The smoke test's HTTP to a host: one stream per request over the SSH transport, no port on the controller.

A real SSH server is too heavy here; the HTTP layer is exercised against a real http.server through real
sockets (a paramiko Channel offers the same sendall/recv/settimeout/close), and `tunnel` against a fake
pyinfra host whose transport hands out such sockets as its direct-tcpip channels.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpx
import paramiko
import pytest

from vllm_fleet.roles.tunnel import URL, StreamTransport, tunnel

KEY = "sk-tunnel-test"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(200, b"")
        elif self.path.startswith("/v1/models"):
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self._send(401, b'{"error": "unauthorized"}')
            else:
                self._send(200, json.dumps({"data": [{"id": "tiny"}], "host": self.headers["Host"],
                                            "path": self.path}).encode())
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"vllm:num_preemptions_total 0\n", b"vllm:x 1\n"):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/slow":
            time.sleep(1.0)
            self._send(200, b"late")
        elif self.path == "/hangup":
            self.close_connection = True
        else:
            self._send(404, b"")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        usage = {"completion_tokens": body["max_tokens"]}
        self._send(200, json.dumps({"echo": body, "usage": usage}).encode())


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        pass  # /slow writes to a client that gave up: expected


@pytest.fixture
def server():
    srv = Server(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv.server_address
    srv.shutdown()
    srv.server_close()


class Opener:
    """Real TCP sockets to the test server, counted: one per request, each closed after it."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.streams: list[socket.socket] = []

    def __call__(self, timeout: float | None) -> socket.socket:
        s = socket.create_connection(self.address, timeout=timeout)
        self.streams.append(s)
        return s


def client(opener, **kw) -> httpx.Client:
    return httpx.Client(base_url=URL, transport=StreamTransport(opener, "127.0.0.1:8000"), **kw)


def test_requests_answers_and_headers(server):
    opener = Opener(server)
    with client(opener, timeout=5.0) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").status_code == 401
        r = c.get("/v1/models?x=1", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
        # the Host a client on the host itself would send; the query travels
        assert r.json() == {"data": [{"id": "tiny"}], "host": "127.0.0.1:8000", "path": "/v1/models?x=1"}
        r = c.post("/v1/completions", json={"model": "tiny", "max_tokens": 4, "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 4
        assert r.json()["echo"]["ignore_eos"] is True
        assert c.get("/chunked").text == "vllm:num_preemptions_total 0\nvllm:x 1\n"
        assert c.get("/nope").status_code == 404
    # a stream per request, none left open
    assert len(opener.streams) == 6
    assert all(s.fileno() == -1 for s in opener.streams)


def test_failures_are_httpx_errors_the_smoke_test_catches(server):
    with client(Opener(server), timeout=httpx.Timeout(5.0, read=0.2)) as c:
        with pytest.raises(httpx.ReadTimeout):
            c.get("/slow")
        with pytest.raises(httpx.RemoteProtocolError):
            c.get("/hangup")

    def refused(timeout: float | None) -> socket.socket:
        raise paramiko.ChannelException(2, "Connect failed")  # vLLM not listening yet

    with client(refused) as c, pytest.raises(httpx.ConnectError, match="Connect failed"):
        c.get("/health")


def test_the_url_alone_reaches_nothing():
    """Used without the transport, the base URL must fail rather than find a local listener."""
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{URL}/health", timeout=5.0)


def _own_tcp_listeners() -> set[str]:
    """Local addresses of LISTEN TCP sockets this process holds (from /proc/net/tcp{,6} by inode)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with_target = os.readlink(fd) if fd.is_symlink() else ""
        if with_target.startswith("socket:["):
            inodes.add(with_target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                out.add(f[1])
    return out


def fake_host(server_address: tuple[str, int], opened: list[tuple]) -> SimpleNamespace:
    """A pyinfra host whose SSH transport's direct-tcpip channels are real sockets to the test server."""

    class Transport:
        def is_active(self) -> bool:
            return True

        def open_channel(self, kind, dest_addr=None, src_addr=None, timeout=None):
            opened.append((kind, dest_addr))
            return socket.create_connection(server_address, timeout=timeout)

    connector = SimpleNamespace(client=SimpleNamespace(get_transport=Transport))
    return SimpleNamespace(name="lab1", connector=connector, connect=lambda: None)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_tunnel_opens_no_listener_on_the_controller(server, monkeypatch):
    before = _own_tcp_listeners()
    assert before, "the test server's own listener should be seen"  # the check can see one
    opened: list[tuple] = []
    bound: list[object] = []
    real_listen = socket.socket.listen
    monkeypatch.setattr(socket.socket, "listen", lambda self, *a: (bound.append(self), real_listen(self, *a)))
    with tunnel(fake_host(server, opened), "0.0.0.0", 8000) as t, t.client(timeout=5.0) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").status_code == 401
        during = _own_tcp_listeners()
    assert during == before and not bound
    # a channel per request, to where a client on the host reaches a server bound to 0.0.0.0
    assert opened == [("direct-tcpip", ("127.0.0.1", 8000))] * 2
    with t.client() as c, pytest.raises(httpx.ConnectError, match="closed"):
        c.get("/health")  # after the block: nothing goes through


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_listener_check_catches_a_forwarded_port():
    """The same check fails for a local port such as the old tunnel's: it can tell."""
    before = _own_tcp_listeners()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert _own_tcp_listeners() - before
