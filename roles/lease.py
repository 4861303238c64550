"""The host lease from the controller's side (the host's side: vllm_fleet/host/lease.py).

A run that changes a host takes its lease at collection, before it reads a single fact of that host, so
what it plans from was not half-changed by another run; it holds it through execution, the smoke test,
the commit or rollback, and gives it back when pyinfra disconnects the host. The lease is held by a
small process on the host, started over a channel of this run's own SSH connection and kept alive by
this controller's heartbeat: a controller that is killed, or whose connection is cut, stops renewing it,
and the next run takes it over once it has expired, saying whose it was.

Read-only work (plan, status, logs, targets, `--dry`) never takes it and never waits for it.
"""

from __future__ import annotations

import atexit
import getpass
import json
import os
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from pyinfra import host, logger, state
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.operations import python

from vllm_fleet.controller.run import DRY_ATTR, HostLease, current
from vllm_fleet.roles import remote
from vllm_fleet.roles.install import HOST_SRC

if TYPE_CHECKING:
    from paramiko.channel import Channel, ChannelFile

SOURCE = (HOST_SRC / "lease.py").read_text()
WAIT_ENV, WAIT_DEFAULT = "VLLM_FLEET_LEASE_WAIT_S", 120.0  # how long a second run waits, then is refused
TTL_ENV, TTL_DEFAULT = "VLLM_FLEET_LEASE_TTL_S", 60.0  # a lease not renewed for this long is expired
# the holder reads its own source from the channel (a fresh host has nothing of ours installed yet);
# os.read, not sys.stdin: a buffered read could swallow the heartbeats behind it
BOOT = ("import json,os,sys\nb=b''\nwhile not b.endswith(b'\\n'):\n c=os.read(0,65536)\n"
        " if not c: sys.exit(1)\n b+=c\nexec(compile(json.loads(b),'lease.py','exec'))")


class LeaseRefused(PyinfraError):
    """Another run holds the host: pyinfra prints the message without a traceback and fails the host."""


def wait_s() -> float:
    return float(os.environ.get(WAIT_ENV, WAIT_DEFAULT))


def ttl_s() -> float:
    return float(os.environ.get(TTL_ENV, TTL_DEFAULT))


class _Channel:
    """One long-lived command on the host: an SSH channel of the host's own connection, or a local
    process for pyinfra's @local connector."""

    def __init__(self, command: str):
        self.chan: Channel | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.out: ChannelFile | IO[bytes]
        if isinstance(host.connector, SSHConnector):
            client = host.connector.client
            transport = client.get_transport() if client is not None else None
            assert transport is not None  # take() opens a channel only on a connected host
            self.chan = transport.open_session()
            self.chan.exec_command(command)
            self.out = self.chan.makefile("rb")
        else:
            self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert self.proc.stdout is not None
            self.out = self.proc.stdout

    def send(self, text: str) -> None:
        data = text.encode()
        if self.chan is not None:
            self.chan.sendall(data)
        else:
            assert self.proc is not None and self.proc.stdin is not None  # the local process's pipe
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def readline(self) -> str:
        return self.out.readline().decode(errors="replace").strip()

    def stderr(self) -> str:
        if self.chan is not None:
            return self.chan.makefile_stderr("rb").read().decode(errors="replace").strip()
        assert self.proc is not None and self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace").strip()

    def close(self) -> None:
        if self.chan is not None:
            self.chan.close()
        elif self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


@dataclass
class Held:
    token: str
    channel: _Channel
    stop: threading.Event = field(default_factory=threading.Event)

    def beat(self, every: float) -> None:
        while not self.stop.wait(every):
            try:
                self.channel.send("beat\n")
            except Exception:  # the connection is gone: the host's holder lets the lease expire
                return

    def ask(self, what: str, until: tuple[str, ...]) -> str:
        """Send one request to the host's holder and read its answer (a line starting with `until`)."""
        try:
            self.channel.send(what + "\n")
            while True:
                said = self.channel.readline()
                if not said or said.startswith(until):
                    return said
        except Exception:
            return ""

    def release(self) -> bool:
        self.stop.set()
        try:
            return self.ask("release", ("released",)) == "released"
        finally:
            self.channel.close()


def _dry() -> bool:
    import pyinfra

    return bool(getattr(state, DRY_ATTR, False) or (pyinfra.is_cli and "--dry" in sys.argv))


def holder(what: str) -> dict[str, str | int]:
    checked = current().logins.get(host.name)
    login = (checked["user"] if checked else None) or host.data.get("ssh_user") or "root"
    command = " ".join([what + ":", os.path.basename(sys.argv[0]), *sys.argv[1:]])[:200]
    return {"controller": socket.gethostname(), "operator": getpass.getuser(), "login": login,
            "pid": os.getpid(), "command": command,
            "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def token() -> str | None:
    """This run's lease token on this host, for the host commands that check it (hoststate.py)."""
    held = current().leases.get(host.name)
    return held.token if held else None


def take(command: str) -> str | None:
    """Hold this host's lease for the rest of the run (collection time, after the login check and
    before any fact of the host is read); its token, or None in a dry run."""
    run = current()
    if host.name in run.leases:
        return run.leases[host.name].token
    if _dry() or not host.connected:  # nothing changes, or nothing is reached (the decisions' tests)
        return None
    if not isinstance(host.connector, SSHConnector | LocalConnector):
        logger.warning(f"[{host.name}] no host lease over pyinfra's {type(host.connector).__name__}: "
                       "another run may change this host at the same time")
        return None
    tok = secrets.token_hex(8)
    argv = ["python3", "-c", BOOT, "hold", tok, json.dumps(holder(command)), f"{wait_s():g}",
            f"{ttl_s():g}"]
    sudo = "sudo -H -n " if remote.connector_arguments().get("_sudo") else ""
    # shown as pyinfra shows its own commands at -vvv (the lease's source abbreviated): one more remote
    # command per host and run
    logger.debug(f"[{host.name}] >>> {sudo}python3 -c <the lease script> hold {tok} ... "
                 f"{wait_s():g} {ttl_s():g}")
    channel = _Channel(sudo + shlex.join(argv))
    channel.send(json.dumps(SOURCE) + "\n")
    while True:
        line = channel.readline()
        if line.startswith("waiting: "):
            logger.info(f"[{host.name}] {line.removeprefix('waiting: ')}; waiting up to {wait_s():g} s")
            continue
        break
    if line.startswith("refused: "):
        channel.close()
        raise LeaseRefused(f"refused, nothing was changed:\n  {host.name}: {line.removeprefix('refused: ')}")
    if line != "held" and not line.startswith("took over "):
        why = channel.stderr() or line or "no answer"
        channel.close()
        raise LeaseRefused(f"refused, nothing was changed:\n  {host.name}: could not take the host lease: "
                           f"{why.splitlines()[-1]}")
    if line.startswith("took over "):
        logger.warning(f"[{host.name}] {line}")
    held = Held(tok, channel)
    if not _UNRELEASED:
        atexit.register(_at_exit)
    _UNRELEASED[id(held)] = held
    threading.Thread(target=held.beat, args=(max(1.0, ttl_s() / 6),), daemon=True).start()
    if not run.leases:  # the run's first lease: give each host's back as pyinfra disconnects it
        state.add_callback_handler(_GiveBack(run.leases))
    run.leases[host.name] = held
    return tok


_UNRELEASED: dict[int, Held] = {}  # every lease this process holds, whichever run took it


def _at_exit() -> None:
    """A process that ends without disconnecting (a crash in pyinfra's own code) still gives back."""
    for held in list(_UNRELEASED.values()):
        held.release()
    _UNRELEASED.clear()


def _still_held(state: State, host: Host) -> bool:
    """pyinfra's callback status: False fails the host before any operation changes it."""
    held = current().leases.get(host.name)
    said = held.ask("check", ("ok", "lost")) if held else "ok"
    if said == "ok":
        return True
    host.log_styled(f"refused, nothing was changed: {said or 'the host lease was lost'}", fg="red",
                    log_func=logger.error)
    return False


def confirm_op() -> None:
    """Where pyinfra asks the operator to confirm (no -y), the heartbeat stops while the prompt waits
    (the prompt blocks the process) and the lease may expire and be taken: the first operation asks the
    host whether it is still this run's."""
    import pyinfra

    if pyinfra.is_cli and not {"-y", "--yes"} & set(sys.argv) and current().leases.get(host.name):
        python.call(name="host lease still held", function=_still_held)


def give_back(name: str, leases: dict[str, HostLease]) -> None:
    held = leases.pop(name, None)
    if held is not None:
        _UNRELEASED.pop(id(held), None)
    if held is not None and not held.release():
        logger.warning(f"[{name}] the host lease could not be given back; it expires after {ttl_s():g} s")


class _GiveBack(BaseStateCallback):
    def __init__(self, leases: dict[str, HostLease]):
        self.leases = leases

    # pyinfra declares its callbacks static, but calls them on the handler it was given
    # (State.trigger_callbacks: getattr(handler, name)(state, ...)): a method gets the same call
    def host_disconnect(self, state: State, host: Host) -> None:  # type: ignore[override]
        give_back(host.name, self.leases)
