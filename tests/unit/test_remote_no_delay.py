"""The SSH connection's socket is made no-delay (see roles/remote.py no_delay): a real TCP socket pair,
the connector's attributes as paramiko's SSHClient and Transport name them."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from vllm_fleet.roles.remote import no_delay


def _host(sock: object) -> SimpleNamespace:
    transport = SimpleNamespace(sock=sock)
    client = SimpleNamespace(get_transport=lambda: transport)
    return SimpleNamespace(connector=SimpleNamespace(client=client))


def test_the_ssh_socket_of_a_connected_host_is_made_no_delay() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        no_delay(_host(sock))  # type: ignore[arg-type]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_proxied_or_local_connection_is_left_alone() -> None:
    no_delay(_host(SimpleNamespace()))  # type: ignore[arg-type]  # a proxy channel: no socket here
    no_delay(SimpleNamespace(connector=SimpleNamespace()))  # type: ignore[arg-type]  # @local
    a, b = socket.socketpair()  # a Unix socket has no Nagle to turn off
    with a, b:
        no_delay(_host(a))  # type: ignore[arg-type]
