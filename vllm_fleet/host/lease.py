#!/usr/bin/env python3
"""One change per host at a time: the host lease a vllm-fleet run holds from before it reads the host
until it has committed (or rolled back) and disconnected.

Runs ON the host (stdlib only, Python >= 3.9). A run that changes a host (deploy, stage, rollback, and
the prune inside a deploy's commit) starts `hold` over its own SSH channel, before it reads a single
fact: a second run meets the lease before it has planned anything from facts the first is about to
change, waits for it up to a bound, then is refused with the holder's name. Its source comes over that
channel's standard input, so a fresh host needs nothing installed first. Installed beside hoststate.py,
it is what hoststate.py imports to check the lease, and what the watchdog's unit asks (`busy`).

The lease is a file, /var/lib/vllm-fleet/lease (root, 0600), naming its holder (controller, login, pid,
command, start) and when it was last renewed. The holder renews it only when its controller's heartbeat
arrives on the channel, so it outlives neither the controller (SIGKILL closes the channel) nor the
connection (a cut one brings no more heartbeats): a lease not renewed within its ttl is expired, and the
next run takes it over and says whose it was. A holder that stops cleanly removes it ("release").

Commands:
    hold TOKEN HOLDER_JSON WAIT_S TTL_S   take the lease (waiting up to WAIT_S), then keep it while
                                           heartbeats come on stdin ("beat"), until "release" or EOF;
                                           "check" answers "ok" while it is still this holder's
    show                                   print the lease, and whether it is live
    busy                                   exit 0 (saying who) while a live lease is held, else 1: the
                                           watchdog restarts nothing a run is changing
    clear                                  remove the lease by hand (an operator's last resort)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing.TypeGuard is Python 3.10; the host may have 3.9
    from typing import TypeGuard

ROOT = os.environ.get("VLLM_FLEET_ROOT", "")  # tests run it against a temporary root
STATE_DIR = ROOT + "/var/lib/vllm-fleet"
LEASE = STATE_DIR + "/lease"
GUARD = STATE_DIR + "/lease.guard"  # flock'd while the lease file is read and replaced


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    fd = os.open(GUARD, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read() -> dict | None:
    try:
        with open(LEASE) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):  # a torn file cannot exist (rename), a hand-edited one can
        return None


def _write(lease: dict) -> None:
    tmp = f"{LEASE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(lease, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, LEASE)


def live(lease: dict | None, now: float | None = None) -> TypeGuard[dict]:
    """Whether a lease still holds: renewed within its ttl."""
    if not lease:
        return False
    now = time.time() if now is None else now
    return now - float(lease.get("renewed", 0)) <= float(lease.get("ttl", 0))


def describe(lease: dict) -> str:
    """Who holds it, in the words an operator needs to find that run."""
    h = lease.get("holder", {})
    return (f"{h.get('command', '?')} by {h.get('login', '?')}@{h.get('controller', '?')} "
            f"(pid {h.get('pid', '?')}), since {lease.get('since', '?')}")


def held_by_other(token: str | None) -> str | None:
    """For the host's own scripts: the live holder when it is not `token` (None: nobody else holds it)."""
    lease = read()
    if live(lease) and lease.get("token") != token:
        return describe(lease)
    return None


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def take(token: str, holder: dict, ttl: float, now: float | None = None) -> tuple[bool, str]:
    """One attempt: (True, what happened) when this token now holds it, else (False, the holder)."""
    now = time.time() if now is None else now
    with _guarded():
        cur = read()
        note = "held"
        if cur and cur.get("token") != token:
            if live(cur, now):
                return False, describe(cur)
            age = now - float(cur.get("renewed", 0))
            note = (f"took over the expired lease of {describe(cur)}: not renewed for {age:.0f} s "
                    "(its controller died or lost its connection)")
        since = cur["since"] if cur and cur.get("token") == token else _stamp(now)
        _write({"token": token, "holder": holder, "since": since, "renewed": now, "ttl": ttl})
        return True, note


def renew(token: str) -> bool:
    with _guarded():
        cur = read()
        if not cur or cur.get("token") != token:
            return False
        cur["renewed"] = time.time()
        _write(cur)
        return True


def release(token: str) -> bool:
    with _guarded():
        cur = read()
        if not cur or cur.get("token") != token:
            return False
        os.unlink(LEASE)
        return True


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hold(token: str, holder: dict, wait_s: float, ttl_s: float) -> int:
    deadline = time.monotonic() + wait_s
    waiting_for = None
    while True:
        ok, said = take(token, holder, ttl_s)
        if ok:
            _say(said)
            break
        if time.monotonic() >= deadline:
            _say(f"refused: the host lease is held by {said}; waited {wait_s:g} s, nothing was changed: "
                 "try again when that run is done")
            return 3
        if said != waiting_for:
            _say(f"waiting: the host lease is held by {said}")
            waiting_for = said
        time.sleep(0.5)
    # kept while heartbeats come; a silent controller is a gone one
    last = time.monotonic()
    buf = b""
    fd = sys.stdin.fileno()
    while True:
        left = ttl_s - (time.monotonic() - last)
        if left <= 0:
            return 0  # no heartbeat within the ttl: the lease is expired, the next run takes it over
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return 0  # the channel closed without a release: left to expire
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line == b"beat":
                if not renew(token):
                    _say("lost: the lease was taken over")
                    return 4
                last = time.monotonic()
            elif line == b"check":  # before execution, after a pause the heartbeat may have missed
                if renew(token):
                    last = time.monotonic()
                    _say("ok")
                else:
                    cur = read()
                    _say("lost: the lease is now held by " + (describe(cur) if cur else "nobody"))
                    return 4
            elif line == b"release":
                release(token)
                _say("released")
                return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["hold"] and len(argv) == 5:
        return hold(argv[1], json.loads(argv[2]), float(argv[3]), float(argv[4]))
    if argv == ["show"]:
        lease = read()
        print(json.dumps({"lease": lease, "live": live(lease)}))
        return 0
    if argv == ["busy"]:
        lease = read()
        if live(lease):
            print(f"<5>not restarting: a vllm-fleet run holds the host lease ({describe(lease)})")
            return 0
        return 1
    if argv == ["clear"]:
        with _guarded(), contextlib.suppress(FileNotFoundError):
            os.unlink(LEASE)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
