"""The smoke test reaches each host's vLLM without a port on the controller.

While `deploys/smoke.py` smoke-tests real lab hosts (over pyinfra's SSH, `live` included: two reads of
/metrics 2 s apart per instance), every process it runs on the controller is polled for listening TCP
sockets. A forwarded local port (the old tunnel) would be one, open to every local user for seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.hosts.conftest import deploy


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def tcp_listeners(pids: set[int]) -> dict[int, set[str]]:
    """pid -> local addresses (hex, as in /proc/net/tcp) of the LISTEN sockets it holds."""
    listening: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":
                listening[f[9]] = f[1]
    out: dict[int, set[str]] = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                out.setdefault(pid, set()).add(listening[target[8:-1]])
    return out


def test_the_poll_sees_a_child_that_listens():
    """The check below can fail: a child of this process listening on loopback is found."""
    child = subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                              "s.bind(('127.0.0.1', 0)); s.listen(); print(flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        assert child.pid in tcp_listeners(descendants(os.getpid()))
    finally:
        child.kill()
        child.wait()


def test_smoke_test_opens_no_listener_on_the_controller(deployed):
    me = os.getpid()
    seen: dict[int, set[str]] = {}
    samples = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal samples
        while not done.is_set():
            pids = descendants(me)
            if pids:
                samples += 1
                for pid, addrs in tcp_listeners(pids).items():
                    seen.setdefault(pid, set()).update(addrs)
            time.sleep(0.05)

    converged = deploy()  # the session's keys (a test before may have rotated one)
    assert converged.rc == 0, converged.output[-4000:]
    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        run = deploy("deploys/smoke.py")
    finally:
        done.set()
        t.join(timeout=5)
    assert run.rc == 0, run.output[-4000:]
    assert run.smoke and all(r["ok"] for r in run.smoke), run.smoke
    assert all(r["live"] is not None for r in run.smoke if r["checks"][0]["name"] != "worker"), run.smoke
    # each instance kept its connection to vLLM open over 2 s (live): far longer than the poll's step
    assert samples >= 20, f"only {samples} polls while pyinfra ran"
    assert not seen, f"listening sockets on the controller during the smoke test: {seen}"
