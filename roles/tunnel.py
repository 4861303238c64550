"""HTTP from the controller to a host's vLLM through pyinfra's own SSH connection.

vLLM binds 127.0.0.1 by default (its /health, /metrics and /version carry no auth), so the controller
cannot reach it directly. Each request opens its own direct-tcpip channel over the SSH transport pyinfra
already holds and speaks HTTP/1.1 on it: no second login, no extra credentials, and no port on the
controller. A forwarded local port (`forward`, the old way) let any local user of the controller talk
to the host's vLLM while a smoke test ran, and anyone who took that port first would have been sent
the API key.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import httpx
from pyinfra import host as current_host
from pyinfra.context import ctx_host

from vllm_fleet.host.watchdog import probe_address

# paramiko logs every refused channel at ERROR while the server is still starting: expected, not news
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)

# Never resolves (RFC 6761): a client that loses the transport fails, instead of sending the key to
# whatever listens at that address on the controller.
URL = "http://vllm.tunnel.invalid"


class Stream(Protocol):
    """What a paramiko Channel and a connected socket both offer, and all the HTTP layer uses."""

    def sendall(self, data: bytes, /) -> object: ...

    def recv(self, n: int, /) -> bytes: ...

    def settimeout(self, timeout: float | None, /) -> None: ...

    def close(self) -> None: ...


Opener = Callable[[float | None], Stream]  # connect timeout -> a new stream to the server


class _Raw(io.RawIOBase):
    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 (a writable buffer)
        data = self._stream.recv(len(b))
        b[: len(data)] = data
        return len(data)


class _Sock:
    """The part of a socket http.client touches. close() is left to the transport: http.client closes
    its socket as soon as it sees `Connection: close`, before the body is read."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def sendall(self, data: bytes) -> None:
        self._stream.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        assert mode == "rb"
        return io.BufferedReader(_Raw(self._stream))

    def close(self) -> None:
        pass


class StreamTransport(httpx.BaseTransport):
    """httpx over a fresh stream per request (one request, then closed): nothing pooled, nothing
    listening. `host_header` is what a client on the server's own host would send."""

    def __init__(self, opener: Opener, host_header: str) -> None:
        self._open = opener
        self._host_header = host_header
        self.closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.closed:
            raise httpx.ConnectError("tunnel closed", request=request)
        timeout = request.extensions.get("timeout", {})
        try:
            stream = self._open(timeout.get("connect"))
        except TimeoutError as e:
            raise httpx.ConnectTimeout(str(e) or "channel open timed out", request=request) from e
        except Exception as e:  # paramiko's ChannelException/SSHException, EOFError, OSError
            raise httpx.ConnectError(f"{type(e).__name__}: {e}", request=request) from e
        try:
            stream.settimeout(timeout.get("read"))
            conn = http.client.HTTPConnection("unused")
            conn.sock = _Sock(stream)  # a set sock: http.client never connects by itself
            conn.putrequest(request.method, request.url.raw_path.decode("ascii"), skip_host=True,
                            skip_accept_encoding=True)
            for k, v in request.headers.raw:
                if k.lower() not in (b"host", b"connection"):
                    conn.putheader(k, v)
            conn.putheader("Host", self._host_header)
            conn.putheader("Connection", "close")
            conn.endheaders(request.read() or None)
            resp = conn.getresponse()
            body = resp.read()
        except TimeoutError as e:
            raise httpx.ReadTimeout(str(e) or "timed out", request=request) from e
        except http.client.HTTPException as e:
            raise httpx.RemoteProtocolError(f"{type(e).__name__}: {e}", request=request) from e
        except OSError as e:
            raise httpx.ReadError(f"{type(e).__name__}: {e}", request=request) from e
        finally:
            with contextlib.suppress(Exception):
                stream.close()
        return httpx.Response(resp.status, headers=resp.getheaders(), stream=httpx.ByteStream(body),
                              extensions={"http_version": b"HTTP/1.1",
                                          "reason_phrase": resp.reason.encode("ascii", "replace")},
                              request=request)


@dataclass(frozen=True)
class Tunnel:
    """httpx needs both: the URL to build requests (it cannot resolve) and the transport to send them."""

    url: str
    transport: StreamTransport

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, transport=self.transport, **kwargs)  # type: ignore[arg-type]


def ssh_opener(host, remote_host: str, remote_port: int) -> Opener:
    """A direct-tcpip channel per call, on pyinfra's transport as it is then (it may have reconnected)."""
    target = probe_address(remote_host)

    def open_channel(timeout: float | None) -> Stream:
        if getattr(host.connector, "client", None) is None:
            host.connect()
        transport = host.connector.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionError(f"no SSH connection to {host.name}")
        return transport.open_channel("direct-tcpip", (target, remote_port), ("127.0.0.1", 0),
                                      timeout=timeout)

    return open_channel


@contextlib.contextmanager
def tunnel(host, remote_host: str, remote_port: int) -> Iterator[Tunnel]:
    """HTTP to remote_host:remote_port as seen from `host`; unusable once the block ends.

    Given pyinfra's `host` proxy, it holds the Host the proxy stands for now: the proxy is per greenlet,
    and requests may be sent from greenlets of their own (the smoke test's checks go out at once)."""
    host = ctx_host.get() if host is current_host else host
    target = probe_address(remote_host)
    host_header = f"[{target}]:{remote_port}" if ":" in target else f"{target}:{remote_port}"
    t = Tunnel(URL, StreamTransport(ssh_opener(host, remote_host, remote_port), host_header))
    try:
        yield t
    finally:
        t.transport.closed = True
