"""Canary, then waves, stopping at the first failure: a fleet change that hits one host before fifty.

Each wave is one pyinfra run of the ordinary deploy over the wave's hosts, in this process
(controller/runner.py), so a wave gets exactly what a single deploy gets (validation before restart,
smoke test, automatic rollback of a host that fails). Waves are driven here, in inventory order,
because `pyinfra --serial` does not keep it. A wave in which any host fails stops the rollout: later
waves are never touched.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_fleet.controller import runner  # before pyinfra itself: gevent, as pyinfra's CLI sets it up
from vllm_fleet.controller.run import FleetRun
from vllm_fleet.core.spec import is_vllm_host, skipped_note
from vllm_fleet.core.tables import columns

if TYPE_CHECKING:
    from pyinfra.api import Inventory

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class HostOutcome:
    host: str
    wave: int
    outcome: str = "untouched"  # updated | unchanged | rolled back | failed | unreachable | untouched
    release: str = "-"
    tp: str = "-"
    latency_ms: float | None = None
    seconds: float | None = None
    detail: str = ""


# what stops a rollout: a deploy that had to roll a host back failed its change
STOPS_ROLLOUT = frozenset({"failed", "unreachable", "rolled back"})
# what stops a rollback: there a host that rolled back did what was asked
STOPS_ROLLBACK = frozenset({"failed", "unreachable"})


@dataclass
class RolloutResult:
    waves: list[list[str]]
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    stopped_at: int | None = None
    seconds: float = 0.0
    what: str = "rollout"  # or "rollback": the word the verdict uses

    @property
    def ok(self) -> bool:
        return self.stopped_at is None

    def table(self) -> str:
        head = ("HOST", "WAVE", "OUTCOME", "RELEASE", "TP", "SMOKE", "TIME")
        rows = [(o.host, str(o.wave), o.outcome, o.release, o.tp,
                 f"{o.latency_ms:.0f} ms" if o.latency_ms is not None else "-",
                 f"{o.seconds:.0f} s" if o.seconds is not None else "-") for o in self.hosts.values()]
        lines = columns(head, rows).splitlines()
        by: dict[str, list[str]] = {}
        for o in self.hosts.values():
            by.setdefault(o.outcome, []).append(o.host)
        lines.append("")
        lines += [f"{k}: {', '.join(v)}" for k, v in by.items()]
        lines += [f"{o.host}: {o.detail}" for o in self.hosts.values() if o.detail]
        if self.ok:
            verdict = f"{self.what} complete"
        else:
            left = [o.host for o in self.hosts.values() if o.outcome == "untouched"]
            verdict = (f"{self.what} STOPPED at wave {self.stopped_at}: later waves were not touched"
                       + (f"; left as they were: {', '.join(left)}" if left else ""))
        lines.append(f"{verdict} ({self.seconds:.0f} s)")
        return "\n".join(lines)


def waves(hosts: Sequence[str], canary: int = 1, wave: str = "1", max_unavailable: int | None = None
          ) -> list[list[str]]:
    """Canary first, then waves of N hosts or P% of the fleet; never more than max_unavailable at once."""
    if canary < 0:
        raise ValueError("--canary must be 0 or more")
    m = re.fullmatch(r"(\d+)(%?)", wave.strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"--wave must be a number of hosts or a percentage, not {wave!r}")
    size = max(1, math.ceil(len(hosts) * int(m.group(1)) / 100)) if m.group(2) else int(m.group(1))
    if max_unavailable is not None:
        if max_unavailable < 1:
            raise ValueError("--max-unavailable must be at least 1")
        size = min(size, max_unavailable)
        canary = min(canary, max_unavailable)
    out = [list(hosts[:canary])] if canary else []
    rest = list(hosts[canary:])
    out += [rest[i:i + size] for i in range(0, len(rest), size)]
    return [w for w in out if w]


def keep_groups_together(plan: list[list[str]], groups: Mapping[str, str]) -> list[list[str]]:
    """A cluster's nodes change together (a group never mixes configs): they all join the wave of the
    first of them, which may make that wave larger than asked."""
    seen: set[str] = set()
    out: list[list[str]] = []
    for w in plan:
        wave = []
        for h in w:
            if h in seen:
                continue
            members = [h] if h not in groups else [m for v in plan for m in v if groups.get(m) == groups[h]]
            wave += [m for m in members if m not in seen]
            seen.update(members)
        if wave:
            out.append(wave)
    return out


def _inventory(inventory: Inventory | str) -> Inventory:
    return runner.load_inventory(inventory) if isinstance(inventory, str) else inventory


def inventory_groups(inventory: Inventory | str) -> dict[str, str]:
    """host -> the cluster it is a node of."""
    found = {h.name: ((h.data.get("vllm") or {}).get("cluster") or {}).get("name")
             for h in _inventory(inventory)}
    return {h: c for h, c in found.items() if c}


def inventory_hosts(inventory: Inventory | str, limit: str | None = None) -> tuple[list[str], list[str]]:
    """(vLLM hosts, hosts without vllm data) in inventory order; only the first are rolled out."""
    inv = _inventory(inventory)
    try:  # read as every other command reads it (a host, a group or a glob)
        wanted = runner.limit_hosts(inv, limit)
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    found = [(h.name, h.data.get("vllm")) for h in inv if wanted is None or h.name in wanted]
    return ([n for n, v in found if is_vllm_host(v)], [n for n, v in found if not is_vllm_host(v)])


def outcome_of(result: runner.Result) -> dict[str, Any]:
    """Each host of the run from pyinfra's State and the deploy's record on it (FleetRun.summary): also
    where no host connected and the deploy never ran."""
    return (result.fleet or FleetRun()).summary(result.state)


def _classify(host: str, outcome: Mapping, error: str | None = None) -> tuple[str, str]:
    """A host's outcome from what the run recorded (vllm_fleet/controller/run.py), not from printed text."""
    mine = [r for r in outcome.get("smoke", []) if r["host"] == host]
    seen = outcome.get("hosts", {}).get(host)
    if seen is None:
        return "failed", error or "not in the run"
    if not seen["connected"]:
        return "unreachable", "could not connect over SSH"
    reason = seen["reason"].removeprefix(f"{host}: ")[:300]  # the table names the host already
    back = [r for r in mine if r.get("note", "").startswith("rolled back")]
    if any("STILL FAILING" in r["note"] for r in back):  # restored, but what it restored does not serve
        return "failed", reason or next(r["note"] for r in back if "STILL FAILING" in r["note"])
    if back:  # the deploy's reason says why
        return "rolled back", (reason or next(r["note"] for r in mine if r.get("note")))
    if not seen["failed"] and not error and mine and all(r["ok"] for r in mine):
        return ("updated" if any(r.get("changed") for r in mine) else "unchanged"), ""
    return "failed", (reason or (error or "")[:300] or "pyinfra failed the host")


def run(inventory: str, deploy: Callable[[], Any], canary: int = 1, wave: str = "1",
        max_unavailable: int | None = None, limit: str | None = None,
        log: Callable[[str], None] = print, what: str = "rollout") -> RolloutResult:
    """deploy: the @deploy function each wave runs (the vLLM deploy, or the rollback); what: "rollback"
    when it is the rollback deploy, for which a host rolled back is the success it asked for."""
    stops = STOPS_ROLLBACK if what == "rollback" else STOPS_ROLLOUT
    inv = runner.load_inventory(inventory)
    hosts, skipped = inventory_hosts(inv, limit)
    if skipped:
        log(f"{what}: {skipped_note(skipped)}")
    if not hosts:
        raise RuntimeError(f"no vLLM hosts in {inventory}" + (f" matching --limit {limit}" if limit else ""))
    plan = keep_groups_together(waves(hosts, canary, wave, max_unavailable), inventory_groups(inv))
    result = RolloutResult(plan, {h: HostOutcome(h, i + 1) for i, w in enumerate(plan) for h in w},
                           what=what)
    t0 = time.monotonic()
    log(f"{what}: {len(hosts)} hosts in {len(plan)} waves: "
        + " | ".join(",".join(w) for w in plan))
    for i, group in enumerate(plan, start=1):
        kind = "canary" if i == 1 and canary else "wave"
        log(f"{what}: {kind} {i}/{len(plan)}: {', '.join(group)} ...")
        tw = time.monotonic()
        ran = runner.run(inv, deploy, group, capture=True)  # shown when a wave stops
        took = time.monotonic() - tw
        outcome = outcome_of(ran)
        for h in group:
            o = result.hosts[h]
            o.outcome, o.detail = _classify(h, outcome, ran.error)
            o.seconds = took
            mine = [r for r in outcome.get("smoke", []) if r["host"] == h]
            if mine:
                o.release = mine[-1]["release"]
                o.tp = str(mine[-1]["tp"])
                o.latency_ms = sum(c["ms"] for r in mine for c in r["checks"] if c["name"] == "completion")
        log(f"{what}: {kind} {i}/{len(plan)} done in {took:.0f} s: "
            + ", ".join(f"{h} {result.hosts[h].outcome}" for h in group))
        if not ran.ok or any(result.hosts[h].outcome in stops for h in group):
            result.stopped_at = i
            tail = "\n".join(ANSI.sub("", ran.output).strip().splitlines()[-12:])
            log(f"{what}: stopping: wave {i} failed; pyinfra's last lines:\n{tail}")
            break
    result.seconds = time.monotonic() - t0
    return result
