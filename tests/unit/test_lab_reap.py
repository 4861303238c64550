"""A lab host's nspawn (or the mirror) that this process started is its child: once it exits it stays a
zombie until reaped, and a zombie still answers kill(pid, 0). `fleetlab._alive` must see it gone, or every
removal and halt in a test run waits out terminate()'s 10 s. Run in a fresh interpreter: an earlier test
importing pyinfra's CLI patches this one with gevent, whose hub reaps children by itself."""

from __future__ import annotations

import subprocess
import sys

ZOMBIE = """
import os, time
import fleetlab as lab
pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
time.sleep(0.2)
os.kill(pid, 0)  # exited, not reaped: the zombie answers, which misled the old check
alive = lab._alive(pid)
try:
    os.kill(pid, 0)
    reaped = False
except ProcessLookupError:
    reaped = True
print(alive, reaped)
"""

RUNNING = """
import os, time
import fleetlab as lab
pid = os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ))
before = lab._alive(pid)
t0 = time.monotonic()
lab.terminate(pid)  # SIGTERM ends sleep at once: the 10 s bound is not waited out
print(before, round(time.monotonic() - t0, 1) < 2, lab._alive(pid))
"""


def _run(script: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_a_child_that_exited_is_gone_and_reaped():
    assert _run(ZOMBIE) == ["False", "True"]


def test_a_running_child_is_alive_and_terminate_returns_once_it_ends():
    assert _run(RUNNING) == ["True", "True", "False"]
