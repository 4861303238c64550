"""A lab host's nspawn (or the mirror) that this process started is its child: once it exits it stays a
zombie until reaped, and a zombie still answers kill(pid, 0). `fleetlab._alive` must see it gone, or every
removal and halt in a test run waits out terminate()'s 10 s."""

from __future__ import annotations

import os
import time

import fleetlab as lab


def test_a_child_that_exited_is_gone_and_reaped():
    pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    time.sleep(0.2)  # exited, not reaped: a zombie
    os.kill(pid, 0)  # the zombie answers, which is what misled the old check
    assert not lab._alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass  # reaped
    else:
        raise AssertionError("the zombie was not reaped")


def test_a_running_child_is_alive_and_terminate_returns_once_it_ends():
    pid = os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ))
    assert lab._alive(pid)
    t0 = time.monotonic()
    lab.terminate(pid)
    assert time.monotonic() - t0 < 2  # SIGTERM ends sleep at once; the 10 s bound is not waited out
    assert not lab._alive(pid)
