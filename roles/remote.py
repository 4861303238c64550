"""How the toolkit reaches a host's root: the login, sudo, and uploads that a non-root login can make.

Real fleets log in as a user with sudo (`ssh_user: deploy`, `_sudo: True`). pyinfra applies the host's
sudo settings to operations and facts, but not to commands run from a callback with
`host.run_shell_command`, and SFTP always writes as the login user. So every direct command goes
through `run()` (the host's own connector arguments, resolved the way pyinfra resolves an operation's),
and every upload of a non-root login lands first in a directory only that login can enter, then is
moved into place as root. A root login keeps the direct path.

`check_login()` runs first on every vLLM host, *without* sudo: a login whose sudo needs a password (or
that has no sudo rights, or is not root and has no `_sudo`) is refused before any command runs as root,
naming the host and the sudoers line it lacks. Passwordless sudo is required, not merely preferred:
pyinfra hands a sudo password to every command as an environment assignment in the argv of `env`,
readable with `ps` by every user of the host, the `vllm` user included; and rollouts run unattended.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FactBase
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.connectors.util import CommandOutput

from vllm_fleet.controller.run import current
from vllm_fleet.core.hostfacts import LoginFacts
from vllm_fleet.host.hoststate import UPLOADS

# What the docs tell an operator to install on each host for the login (docs/operations.md).
SUDOERS_FILE = "/etc/sudoers.d/vllm-fleet"
# Uploads of a non-root login, under its own home: 0700, so no other user (vllm included) ever sees a
# file in transit; pyinfra's default temp dir (/tmp) would hold an env file world-readable meanwhile.


def sudoers_line(user: str) -> str:
    return f"{user} ALL=(root) NOPASSWD: ALL"


class LoginRefused(PyinfraError):
    """The login cannot become root without a person typing a password: nothing was run as root."""


class LoginAccess(FactBase[LoginFacts]):
    """
    Returns who the login is and whether it can become root without a password, read *without* sudo
    (pyinfra would otherwise prompt for a password at the first sudo command):

    .. code:: python

        {"user": "deploy", "uid": 1000, "home": "/home/deploy", "sudo": "ok", "sudo_says": ""}
    """

    def command(self) -> str:
        return ("echo \"user $(id -un)\"; echo \"uid $(id -u)\"; echo \"home $HOME\"; "
                "if [ \"$(id -u)\" = 0 ]; then echo 'sudo root'; "
                "elif ! command -v sudo >/dev/null 2>&1; then echo 'sudo absent'; "
                # exactly the shape pyinfra runs (sudo -H -n sh -c ...), so a sudoers rule that allows
                # only some commands is caught here too
                "elif out=$(sudo -H -n sh -c 'id -u' 2>&1); then echo \"sudo ok $out\"; "
                "else echo \"sudo no $out\" | head -n 1; fi")

    def process(self, output: list[str]) -> LoginFacts:
        found: LoginFacts = {"user": "?", "uid": -1, "home": "", "sudo": "no", "sudo_says": ""}
        for line in output:
            key, _, value = line.partition(" ")
            if key == "uid":
                found["uid"] = int(value) if value.strip().isdigit() else -1
            elif key == "sudo":
                word, _, rest = value.partition(" ")
                found["sudo"], found["sudo_says"] = word, rest.strip()
            elif key == "user":
                found["user"] = value.strip()
            elif key == "home":
                found["home"] = value.strip()
        if found["sudo"] == "ok" and found["sudo_says"] != "0":  # sudo ran, but not as root
            found["sudo"] = "no"
        return found


_UNSUPPORTED = ("_su_user", "_doas", "_dzdo")


def login_problem(name: str, login: LoginFacts, args: dict[str, Any]) -> str | None:
    """Why this login cannot deploy (None when it can): pure, from LoginAccess and the host's
    resolved connector arguments."""
    user = login["user"]
    fix = f"`{sudoers_line(user)}` in {SUDOERS_FILE}"
    used = [k for k in _UNSUPPORTED if args.get(k)]
    if used:
        return (f"{name}: {', '.join(used)}: only sudo is supported for becoming root; log in as a user "
                f"with passwordless sudo ({fix}) or as root")
    if args.get("_sudo_user") not in (None, "", "root"):
        return (f"{name}: _sudo_user: {args['_sudo_user']!r}: the vLLM deploy needs root; leave "
                "_sudo_user unset")
    for key in ("_sudo_password", "_use_sudo_password"):  # the second: pyinfra 2's prompt switch
        if args.get(key):
            return (f"{name}: {key}: refused: pyinfra passes a sudo password to every command in the "
                    "argv of `env`, where every user of the host (the vllm user included) can read it "
                    f"with ps; give the login passwordless sudo instead: {fix}")
    if login["uid"] == 0:
        return None
    if not args.get("_sudo"):
        return (f"{name}: the login {user!r} is not root and `_sudo` is not set: set `_sudo: True` in the "
                f"host's data; the login then needs {fix}")
    if login["sudo"] == "absent":
        return f"{name}: the login {user!r} has `_sudo` set but sudo is not installed on the host"
    if login["sudo"] != "ok":
        says = login["sudo_says"] or "sudo refused"
        return (f"{name}: the login {user!r} cannot become root without a password ({says}); vllm-fleet "
                f"never types a sudo password: the login needs {fix}")
    return None


def connector_arguments(on: Host | None = None) -> dict[str, Any]:
    """A host's sudo (and shell) settings, resolved as pyinfra resolves them for an operation:
    deploy kwargs, then host data, then config (`--sudo` on the command line)."""
    args, _ = pop_global_arguments(state, host if on is None else on, {})
    return {k: v for k, v in args.items() if k in CONNECTOR_ARGUMENT_KEYS}


def no_delay(h: Host) -> None:
    """Turn off Nagle's algorithm on the host's SSH connection, which paramiko leaves on. A run talks to
    a host in small exchanges (fact commands, the lease's lines, tunnelled smoke requests); with Nagle
    each small write waits until the host acknowledges the previous one, and the host delays that
    acknowledgement (about 40 ms on Linux), so every exchange paid that wait. A connection through a
    proxy (no socket of its own here) is left as it is."""
    client = getattr(h.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):  # a connection already gone fails at its next command
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def login_problem_of(on: Host | None = None) -> str | None:
    """Why this host's login cannot become root (None when it can); read once per run and host, the
    run's first exchange with it (so its connection is made no-delay first)."""
    h = host if on is None else on
    logins = current().logins
    if h.name not in logins:
        no_delay(h)
        login = h.get_fact(LoginAccess, _sudo=False)
        if not login:
            return f"{h.name}: could not read the login's identity (see above)"
        args = {**connector_arguments(h), "_use_sudo_password": h.data.get("_use_sudo_password")}
        problem = login_problem(h.name, login, args)
        if problem:
            return problem
        logins[h.name] = login
    return None


def check_login() -> LoginFacts:
    """Collection time, before any command as root: refuse a login that cannot deploy."""
    problem = login_problem_of()
    if problem:
        raise LoginRefused(f"refused, nothing was changed:\n  {problem}")
    return current().logins[host.name]


def upload_dir() -> str | None:
    """Where this host's login uploads before root moves a file into place; None for a root login
    (which writes straight into root-only staging directories). Beside the releases and models, on
    their file system, not in the login's home: a large model never fills /home, and the move into
    place is a rename."""
    login = check_login()
    if login["uid"] == 0:
        return None
    return f"{UPLOADS}/{login['user']}"


def make_upload_dir(path: str) -> str:
    """Root makes the login's upload directory, 0700 and the login's own, inside a root-owned 0711 one
    (nobody lists another login's uploads); `install -d` also tightens an existing directory."""
    user = shlex.quote(path.rsplit("/", 1)[-1])
    return (f"install -d -m 0711 -o root -g root {UPLOADS} && "
            f"install -d -m 0700 -o {user} -g \"$(id -g {user})\" {shlex.quote(path)}")


def run(command: str, on: Host | None = None) -> tuple[bool, CommandOutput]:
    """A command run from a callback (commit, restore, journal, wheel unpacking, bench, a load
    balancer's drain), as root through that host's own sudo settings, exactly like an operation's."""
    return (host if on is None else on).run_shell_command(command, **connector_arguments(on))


def run_live(on: Host, command: str, what: str, unharmed: str, tail: int = 4) -> bool:
    """A long step run from a callback (a build, a fetch, a validation) whose progress lines appear in
    pyinfra's output as they come; a failure fails the host with the step's last words and what it
    left untouched (`unharmed`), as a plain message, no traceback."""
    ok, out = on.run_shell_command(command, print_output=True, **connector_arguments(on))
    if ok:
        return True
    reason = " ".join((out.stderr_lines or out.stdout_lines)[-tail:]) or "no reason given"
    on.log_styled(f"{what} failed, {unharmed}: {reason}", fg="red", log_func=logger.error)
    current().failures.setdefault(on.name, f"{on.name}: {what} failed: {reason}")
    return False


def run_text(command: str) -> tuple[bool, str]:
    """`run` with stdout and stderr joined, for reads and repairs outside pyinfra's operation log."""
    ok, out = run(command)
    return ok, out.output
