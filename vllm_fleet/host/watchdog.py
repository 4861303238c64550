"""Host side, stdlib only: one watchdog probe of a vLLM instance, run by its systemd timer.

Why a real completion: vLLM's /health asks the API server whether it has *noticed* the engine die, so an
engine core that is alive but hung (deadlocked, stopped, stuck in a kernel) keeps /health at 200 while
every request waits forever. Only a request through the engine proves it is serving.

Why the shape: the probe talks to a process that may be hostile, so it runs unprivileged in the same
sandbox as vLLM's own unit and can only say "restart" through its exit status; the root part of its unit
is a fixed command that restarts one fixed unit. The decision is pure (`decide`) and unit-tested; the
rest is I/O.

The probe never restarts an instance that has not served since it (re)started, until the unit's start
timeout has passed: a model still loading is not hung. Failures count only in a row and within the
bound, so a stale failure from an hour ago and a success in between both reset the count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

try:
    from vllm_fleet.host.metrics import GENERATED, PROMPTED, parse
except ImportError:  # on the host, uploaded beside this script
    from metrics import GENERATED, PROMPTED, parse  # type: ignore[import-not-found,no-redef]

RESTART = 75  # exit status that asks the unit's ExecStopPost= to restart the instance
# the probe unit's StateDirectory= and RuntimeDirectory= (under /var/lib and /run)
STATE_NAME = "vllm-watchdog-{}"
# what the unit's root pre-step records of the instance, and its stop step compares before a restart
UNIT_STATE = "-p InvocationID -p ActiveState -p ActiveEnterTimestampMonotonic"


def holders_command(port: int, unit: str) -> str:
    """Root's part of a probe, for its unit's ExecStartPre: each process listening on the instance's port
    that is not in the instance's own cgroup, one per line ("comm (pid N)"). During a restart the port is
    free for a moment, and a local user who binds it then would receive the key the probe sends; so the
    probe sends nothing while this lists anyone (the smoke test checks the same before its requests).
    Written for a unit file: `$$` is systemd's literal `$`, and no backslash or single quote."""
    pattern = unit.replace(".", "[.]")
    return ("command -v ss >/dev/null || { echo cannot tell who listens: no ss; exit 0; }; "
            f'for p in $$(ss -ltnp "sport = :{port}" 2>/dev/null | grep -o "pid=[0-9]*" | cut -d= -f2 '
            "| sort -un); do "
            f'grep -qE "/{pattern}(/|$$)" /proc/$$p/cgroup 2>/dev/null || '
            'echo "$$(cat /proc/$$p/comm 2>/dev/null) (pid $$p)"; done')
PROMPT = "ping"


@dataclass
class State:
    """What the probe remembers between runs (the unit's StateDirectory)."""

    invocation: str = ""
    armed: bool = False  # served at least once since this invocation started
    failures: list[float] = field(default_factory=list)  # monotonic times of failures in a row
    last_error: str = ""

    @classmethod
    def load(cls, text: str) -> State:
        try:
            d = json.loads(text)
            return cls(str(d["invocation"]), bool(d["armed"]), [float(t) for t in d["failures"]],
                       str(d.get("last_error", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls()

    def dump(self) -> str:
        return json.dumps({"invocation": self.invocation, "armed": self.armed, "failures": self.failures,
                           "last_error": self.last_error})


@dataclass(frozen=True)
class Unit:
    """The instance's unit as systemd reports it (`systemctl show`, written by the root pre-step)."""

    invocation: str
    active: bool
    started: float  # monotonic seconds when it entered "active"

    @classmethod
    def parse(cls, text: str) -> Unit:
        props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        started = props.get("ActiveEnterTimestampMonotonic", "0") or "0"
        return cls(props.get("InvocationID", ""), props.get("ActiveState") == "active",
                   int(started) / 1e6 if started.isdigit() else 0.0)


def decide(state: State, unit: Unit, ok: bool | None, error: str, now: float, *,
           failures: int, window_s: float, grace_s: float, busy: float = 0.0) -> tuple[State, str, bool]:
    """(new state, what to log, restart?) for one probe; ok None: not probed (unit not active).

    busy: tokens the engine processed while this probe waited (its counters in /metrics before and
    after). A probe that failed while the engine made progress met a full queue, not a hung engine:
    not counted. A frozen engine's counters stand still."""
    if unit.invocation != state.invocation:
        state = State(invocation=unit.invocation)
    if ok is None:
        return State(invocation=unit.invocation), "", False
    if ok:
        note = "" if state.armed and not state.failures else "serving"
        return State(unit.invocation, armed=True), note, False
    if busy > 0:
        return state, (f"probe failed ({error}) while the engine processed {busy:.0f} tokens: busy, "
                       "not hung; not counted"), False
    recent = [t for t in state.failures if now - t <= window_s] + [now]
    state = State(unit.invocation, state.armed, recent, error)
    if not state.armed and now - unit.started < grace_s:
        return State(unit.invocation), (f"not serving yet ({error}); started {now - unit.started:.0f} s "
                                        f"ago, waiting up to {grace_s:.0f} s before counting"), False
    if len(recent) < failures:
        return state, f"probe failed ({error}): {len(recent)} of {failures} in a row", False
    return State(unit.invocation), (f"{len(recent)} probes failed in a row (last: {error}): "
                                    "restarting the instance"), True


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the key elsewhere: it is a failed probe."""

    def redirect_request(self, *args, **kwargs):
        return None


# no proxy from the environment and no redirects: the probe talks to this host's vLLM and nothing else
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def probe(url: str, model: str, api_key: str | None, timeout_s: float) -> tuple[bool, str]:
    """One tiny real completion; (served, why not). Anything the server sends back other than a
    completion is a failure, never a crash of the probe."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers, method="POST")
    t0 = time.monotonic()
    late = f"no answer to a completion within {timeout_s:.0f} s"
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            data = json.loads(resp.read(1 << 20))
        if not isinstance(data, dict) or not data.get("choices"):
            return False, "an answer that is not a completion"
        return True, f"{time.monotonic() - t0:.2f} s"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code} on POST /v1/completions"
    except TimeoutError:
        return False, late
    except Exception as e:  # noqa: BLE001  whatever a broken or hostile server does
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return False, late
        return False, f"{type(reason).__name__}"


def progress(url: str, timeout_s: float = 5.0, api_key: str | None = None) -> float | None:
    """The engine's prompt + generated token counters from /metrics (with the key: the key guard opens
    /metrics only where the inventory says so), None if unread."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with _OPENER.open(urllib.request.Request(f"{url}/metrics", headers=headers),
                          timeout=timeout_s) as resp:
            values = parse(resp.read(4 << 20).decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001
        return None
    if GENERATED not in values and PROMPTED not in values:
        return None
    return values.get(GENERATED, 0.0) + values.get(PROMPTED, 0.0)


def probe_address(bind: str) -> str:
    """Where a client on the host itself reaches a server bound to `bind`."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind


def serve_target(config_text: str) -> tuple[str, int, str | None]:
    """(address to reach, port, served model name) from a rendered serve config (flat `key: value`
    lines; read without a YAML library, host side)."""
    pairs = re.findall(r"^([a-z-]+): *(.+?)\s*$", config_text, re.M)
    vals = {k: v.strip().strip("'\"") for k, v in pairs}
    address = probe_address(vals.get("host", "127.0.0.1"))
    return address, int(vals.get("port", 8000)), vals.get("served-model-name")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="the instance's live serve config")
    p.add_argument("--unit", required=True, help="the instance's unit, for messages")
    p.add_argument("--unit-state", required=True, help="file with the unit's `systemctl show` output")
    p.add_argument("--state", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--failures", type=int, required=True)
    p.add_argument("--window", type=float, required=True, help="seconds a failure is remembered")
    p.add_argument("--grace", type=float, required=True)
    p.add_argument("--holders", help="file listing who else listens on the port (holders_command)")
    a = p.parse_args(argv)
    with open(a.unit_state) as f:
        unit = Unit.parse(f.read())
    try:
        with open(a.state) as f:
            state = State.load(f.read())
    except FileNotFoundError:
        state = State()
    ok: bool | None = None
    error, busy = "", 0.0
    others = ""
    if a.holders:
        with contextlib.suppress(FileNotFoundError), open(a.holders) as f:
            others = ", ".join(line.strip() for line in f if line.strip())
    if unit.active and others:  # not probed, not counted: the key goes to the instance only
        print(f"<4>{a.unit}: not probed: its port is held by {others}, not {a.unit}; the key was not sent",
              flush=True)
    elif unit.active:
        with open(a.config) as f:
            address, port, model = serve_target(f.read())
        url = f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"
        key = os.environ.get("VLLM_API_KEY") or None
        before = progress(url, api_key=key)
        ok, error = probe(url, model or "", key, a.timeout)
        after = progress(url, api_key=key) if not ok and before is not None else None
        busy = after - before if after is not None and before is not None else 0.0
    state, note, restart = decide(state, unit, ok, error, time.monotonic(), failures=a.failures,
                                  window_s=a.window, grace_s=a.grace, busy=busy)
    tmp = f"{a.state}.tmp"
    with open(tmp, "w") as f:
        f.write(state.dump())
    os.replace(tmp, a.state)
    if note:  # journal priorities: <4> warning for a restart, <5> notice otherwise (LogLevelMax=notice)
        print(f"{'<4>' if restart else '<5>'}{a.unit}: {note}", flush=True)
    return RESTART if restart else 0


if __name__ == "__main__":
    sys.exit(main())
