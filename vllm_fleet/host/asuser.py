"""Run a function with another user's rights only, in a child process; host side, stdlib only.

Why: root must not act inside a directory an unprivileged user can change under it (the vllm user's
HF cache): a link planted there would be followed with root's rights. The child gives up root before
`work` runs and never returns into the caller's code (every path ends in _exit); the answer comes back
as JSON through a pipe, and a child that died is an error, not an empty answer.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable
from typing import Any


def run_as(user: str, work: Callable[[], Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """{"result": work()} computed as `user` (its HOME set, plus `env`), or {"error": why}."""
    pw = pwd.getpwnam(user)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.closerange(3, min(r, w))  # nothing root opened (a lock, a log) stays reachable
            os.closerange(max(r, w) + 1, 65536)
            os.close(r)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.environ.update(HOME=pw.pw_dir, **(env or {}))
            try:
                out = {"result": work()}
            except Exception as e:
                out = {"error": f"{type(e).__name__}: {e}"}
            os.write(w, json.dumps(out).encode())
            rc = 0
        finally:
            os._exit(rc)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        return {"error": f"the work as {user} ended with status {status} and no answer"}
    return json.loads(data)
