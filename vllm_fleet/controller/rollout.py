"""Canary, then waves, stopping at the first failure: a fleet change that hits one host before fifty.

Each wave is one pyinfra run of the ordinary deploy over `--limit <the wave's hosts>`, so a wave gets
exactly what a single deploy gets (validation before restart, smoke test, automatic rollback of a host
that fails). Waves are driven here, in inventory order, because `pyinfra --serial` does not keep it.
A wave that exits non-zero stops the rollout: later waves are never touched.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.core.spec import is_vllm_host, skipped_note
from vllm_fleet.core.tables import columns
from vllm_fleet.deploy.run import OUTCOME_ENV

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


@dataclass
class RolloutResult:
    waves: list[list[str]]
    hosts: dict[str, HostOutcome] = field(default_factory=dict)
    stopped_at: int | None = None
    seconds: float = 0.0

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
        verdict = ("rollout complete" if self.ok else
                   f"rollout STOPPED at wave {self.stopped_at}: later waves were not touched")
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


def _read_inventory(inventory: str, expression: str) -> object:
    """Evaluate `expression` over `inv`, the inventory as pyinfra itself loads it (the deploy's loader)."""
    code = ("import json, sys; from pyinfra.api import Config, State; "
            "from pyinfra.context import ctx_config, ctx_state; "
            "from pyinfra_cli.inventory import make_inventory; "
            "ctx_config.set(Config()); ctx_state.set(State()); sys.path.append('.'); "
            f"inv = make_inventory(sys.argv[1]); print(json.dumps({expression}, default=str))")
    out = subprocess.run([sys.executable, "-c", code, inventory], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"cannot load inventory {inventory}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def inventory_groups(inventory: str) -> dict[str, str]:
    """host -> the cluster it is a node of."""
    found = _read_inventory(inventory, "{h.name: ((h.data.get('vllm') or {}).get('cluster') or {})"
                                       ".get('name') for h in inv}")
    assert isinstance(found, dict)
    return {h: c for h, c in found.items() if c}


def inventory_hosts(inventory: str, limit: str | None = None) -> tuple[list[str], list[str]]:
    """(vLLM hosts, hosts without vllm data) in inventory order; only the first are rolled out."""
    found = _read_inventory(inventory, "[(h.name, h.data.get('vllm')) for h in inv]")
    assert isinstance(found, list)
    names = [name for name, _ in found]
    if limit:
        wanted = [n.strip() for n in limit.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise RuntimeError(f"--limit names hosts not in the inventory: {', '.join(unknown)}")
        found = [(name, v) for name, v in found if name in wanted]
    return ([n for n, v in found if is_vllm_host(v)], [n for n, v in found if not is_vllm_host(v)])


def _pyinfra(inventory: str, deploy: str, hosts: list[str], outcome_json: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "pyinfra"
    env = {**os.environ, OUTCOME_ENV: outcome_json}
    # one --limit per host: pyinfra reads a comma-joined list as one pattern, matching nothing
    limits = [arg for h in hosts for arg in ("--limit", h)]
    cmd = [str(exe), "-y", *limits, inventory, deploy]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def _classify(host: str, outcome: Mapping, rc: int, output: str = "") -> tuple[str, str]:
    """A host's outcome from the run's outcome file (vllm_fleet/deploy/run.py), not from printed text.
    Only a run in which no host connected writes none (the deploy never ran): then pyinfra's own
    connection error is the one thing read from its output."""
    mine = [r for r in outcome.get("smoke", []) if r["host"] == host]
    seen = outcome.get("hosts", {}).get(host)
    if seen is None:
        if re.search(rf"\[{re.escape(host)}\] (Could not connect|Connection|Authentication)", output):
            return "unreachable", "could not connect over SSH"
        return "failed", f"pyinfra exited {rc} before recording an outcome (see its output)"
    if not seen["connected"]:
        return "unreachable", "could not connect over SSH"
    if any(r.get("note", "").startswith("rolled back") for r in mine):
        return "rolled back", next(r["note"] for r in mine if r.get("note"))
    if not seen["failed"] and mine and all(r["ok"] for r in mine):
        return ("updated" if any(r.get("changed") for r in mine) else "unchanged"), ""
    return "failed", (seen["reason"][:300] or f"pyinfra exited {rc}")


def run(inventory: str, deploy: str = "vllm_fleet.deploy.vllm.deploy_vllm", canary: int = 1, wave: str = "1",
        max_unavailable: int | None = None, limit: str | None = None,
        log: Callable[[str], None] = print) -> RolloutResult:
    hosts, skipped = inventory_hosts(inventory, limit)
    if skipped:
        log(f"rollout: {skipped_note(skipped)}")
    if not hosts:
        raise RuntimeError(f"no vLLM hosts in {inventory}" + (f" matching --limit {limit}" if limit else ""))
    plan = keep_groups_together(waves(hosts, canary, wave, max_unavailable), inventory_groups(inventory))
    result = RolloutResult(plan, {h: HostOutcome(h, i + 1) for i, w in enumerate(plan) for h in w})
    t0 = time.monotonic()
    log(f"rollout: {len(hosts)} hosts in {len(plan)} waves: "
        + " | ".join(",".join(w) for w in plan))
    for i, group in enumerate(plan, start=1):
        kind = "canary" if i == 1 and canary else "wave"
        log(f"rollout: {kind} {i}/{len(plan)}: {', '.join(group)} ...")
        with tempfile.TemporaryDirectory() as tmp:
            outcome_json = Path(tmp) / "outcome.json"
            tw = time.monotonic()
            proc = _pyinfra(inventory, deploy, group, str(outcome_json))
            took = time.monotonic() - tw
            outcome = json.loads(outcome_json.read_text()) if outcome_json.exists() else {}
        output = ANSI.sub("", proc.stdout + proc.stderr)  # shown when a wave stops
        for h in group:
            o = result.hosts[h]
            o.outcome, o.detail = _classify(h, outcome, proc.returncode, output)
            o.seconds = took
            mine = [r for r in outcome.get("smoke", []) if r["host"] == h]
            if mine:
                o.release = mine[-1]["release"]
                o.tp = str(mine[-1]["tp"])
                o.latency_ms = sum(c["ms"] for r in mine for c in r["checks"] if c["name"] == "completion")
        log(f"rollout: {kind} {i}/{len(plan)} done in {took:.0f} s: "
            + ", ".join(f"{h} {result.hosts[h].outcome}" for h in group))
        if proc.returncode != 0:
            result.stopped_at = i
            tail = "\n".join(output.strip().splitlines()[-12:])
            log(f"rollout: stopping: wave {i} failed (pyinfra exit {proc.returncode}); last lines:\n{tail}")
            break
    result.seconds = time.monotonic() - t0
    return result
