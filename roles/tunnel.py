"""HTTP from the controller to a host's vLLM through pyinfra's own SSH connection.

vLLM binds 127.0.0.1 by default (its /health, /metrics and /version carry no auth), so the controller
cannot reach it directly. A local port forwarded over the existing SSH transport (paramiko direct-tcpip)
lets the smoke test speak real HTTP to the server without opening the port, and needs no second SSH
login or extra credentials.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Iterator

from fleet.watchdog import probe_address

# paramiko logs every refused channel at ERROR while the server is still starting: expected, not news
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)


def _pump(a, b) -> None:
    try:
        while True:
            r, _, _ = select.select([a, b], [], [], 1.0)
            for src in r:
                data = src.recv(65536)
                if not data:
                    return
                (b if src is a else a).sendall(data)
    except OSError:
        return
    finally:
        for s in (a, b):
            with contextlib.suppress(Exception):
                s.close()


@contextlib.contextmanager
def forward(host, remote_host: str, remote_port: int) -> Iterator[str]:
    """Yield a base URL on the controller's loopback that reaches remote_host:remote_port on `host`."""
    if getattr(host.connector, "client", None) is None:
        host.connect()
    transport = host.connector.client.get_transport()
    target = probe_address(remote_host)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()
    # wakes the accept loop at exit: polling with a timeout instead cost every smoke test that timeout
    wake_r, wake_w = socket.socketpair()

    def accept() -> None:
        while not stop.is_set():
            r, _, _ = select.select([listener, wake_r], [], [], 5.0)
            if listener not in r:
                continue
            try:
                conn, peer = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                chan = transport.open_channel("direct-tcpip", (target, remote_port), peer)
            except Exception:  # the far side refused: let the client see a closed connection
                with contextlib.suppress(Exception):
                    conn.close()
                continue
            threading.Thread(target=_pump, args=(conn, chan), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        wake_w.send(b"x")
        t.join(timeout=2)
        for sock in (listener, wake_r, wake_w):
            sock.close()
