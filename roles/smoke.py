"""Wait until a host's instances are ready, smoke-test them through real HTTP, and roll back on failure.

A change is only kept once it has served a real completion. Three operations, in pyinfra's results as
what they are: the smoke test (its verdict), the rollback (runs only after a failed change: puts the
host's last known good release, config and unit back from the host's own snapshot, restarts,
smoke-tests that, and fails the host with the reason and the journal's last lines), and the commit.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_host
from pyinfra.operations import server

from vllm_fleet.controller import smoke
from vllm_fleet.controller.run import FleetRun, current
from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.hostfacts import ListenerFacts
from vllm_fleet.core.layout import CONFIG_DIR, HOST_TOOLS, STAGED
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.host import effective
from vllm_fleet.host.watchdog import probe_address
from vllm_fleet.roles import lease, remote
from vllm_fleet.roles.facts import LISTEN_SH, listeners_of, sections_of
from vllm_fleet.roles.tunnel import tunnel

HOSTSTATE_SCRIPT = f"python3 {HOST_TOOLS}/hoststate.py"


def hoststate(args: str) -> str:
    """A hoststate.py command of this run: with the run's lease token, so a run that lost its lease
    (expired and taken over) cannot commit or restore under the run that holds it now."""
    tok = lease.token()
    return f"{HOSTSTATE_SCRIPT}{f' --lease {tok}' if tok else ''} {args}"


class SmokeFailed(PyinfraError):
    pass


class ChangeFailed(SmokeFailed):
    """A smoke test failed after this run changed the host: what the rollback operation needs."""

    def __init__(self, message: str, results: list[smoke.SmokeResult], reason: str, tail: str,
                 worker_of: NodeRole | None = None):
        super().__init__(message)
        self.results, self.reason, self.tail, self.worker_of = results, reason, tail, worker_of


@dataclass(frozen=True)
class Target:
    """What the smoke test needs of an instance, from the plan or read back from a restored config."""

    name: str
    served_name: str
    host: str
    port: int
    api_key_env: str | None
    tp: int = 1
    # a node group's id, its store address "master-addr:master-port"; headless: a worker (no API)
    group: str | None = None
    headless: bool = False

    @property
    def unit(self) -> str:
        return f"vllm-{self.name}.service"

    @classmethod
    def of(cls, inst: InstancePlan) -> Target:
        node = inst.node
        return cls(inst.name, inst.served_name, inst.host, inst.port, inst.secret_env.get("VLLM_API_KEY"),
                   inst.tensor_parallel, group=node.store if node else None,
                   headless=bool(node and not node.is_head))


run = remote.run_text


def commit_command(plan: HostPlan) -> str:
    """Record the smoke-tested state as last known good, then prune. Its own operation (commit_op), run
    only after the smoke test passed: a commit that fails fails the host, since the next failed change
    would otherwise roll back to an older state than the one serving now."""
    return f"{hoststate('commit ' + shlex.quote(plan.release))} && {hoststate(f'prune {plan.keep_releases}')}"


def commit_op(plan: HostPlan, when: Callable[[], bool], possible: bool) -> None:
    """when: read at execution, after the smoke test passed (a node group's change is known only then);
    possible: False where collection already knows nothing changes, so a converged host has no commit
    operation at all, in the proposed changes or the results."""
    if possible:
        server.shell(name=f"record {plan.release} as the last known good state",
                     commands=[commit_command(plan)], _if=when)


def journal(unit: str, lines: int = 25) -> str:
    ok, out = run(f"journalctl -u {unit} -n {lines} --no-pager -o cat")
    return out if ok else "(journal unavailable)"


def effective_check(inst: InstancePlan) -> smoke.Check:
    """What the instance's new process says it runs with (its start-up log) against the plan's flags:
    the proof that a rendered flag is in effect, not only written down. The host check's list of
    settings at vLLM's defaults (absent from that log) is read in the same command."""
    ok, out = run(effective_command(inst))
    defaults_text, _, log = out.partition(f"{_LOG_MARK}\n")
    try:
        found = json.loads(defaults_text) if defaults_text.strip() else None
    except json.JSONDecodeError:
        found = None
    if isinstance(found, list):  # written by a check before the settings were: the list alone
        found = {"at_default": found}
    at_default, settings = (found.get("at_default"), found.get("settings")) if found else (None, None)
    problems, confirmed = effective.check_log(inst.flags, log.splitlines() if ok else [], at_default,
                                              settings)
    if problems:
        return smoke.Check("config", False, "; ".join(problems))
    return smoke.Check("config", True, f"{confirmed} of {len(inst.flags)} in the log")


_LOG_MARK = "## start-up log"


def effective_command(inst: InstancePlan) -> str:
    """One remote command: the host check's at-default file, then this start's two lines (by the unit's
    InvocationID)."""
    grep = f"grep -F -e {shlex.quote(effective.NON_DEFAULT)} -e {shlex.quote(effective.ENGINE_MARK)}"
    return (f"cat {STAGED}/{inst.name}.yaml.at-default 2>/dev/null; echo; echo '{_LOG_MARK}'; "
            f"id=$(systemctl show -p InvocationID --value {inst.unit}) && test -n \"$id\" && "
            f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=$id | {grep}")


def routes_command(inst: InstancePlan) -> str:
    """The routes the release's own vLLM registers for the live config, listed by the validate step
    (vllm_fleet/host/validate_serve.py, vllm_fleet/host/keyguard.py): no second import of vLLM after the
    restart."""
    return f"cat {STAGED}/{inst.name}.yaml.routes.json 2>&1"


def guard_check(plan: HostPlan, inst: InstancePlan) -> smoke.Check:
    """Every route of the new process but the open ones answers 401 without the key."""
    ok, out = run(routes_command(inst))
    lines = out.strip().splitlines()
    try:
        routes = json.loads(lines[-1]) if ok and lines else None
    except json.JSONDecodeError:
        routes = None
    if not isinstance(routes, list):
        return smoke.Check("no-key-401", False, "the host could not list vLLM's routes: "
                           + (lines[-1][-300:] if lines else "no output"))
    opened = inst.environment.get("VLLM_FLEET_OPEN_PATHS", "/health").split(",")
    with tunnel(host, inst.host, inst.port) as t:
        return smoke.guard_check(t.url, routes, opened, transport=t.transport)


def _replace(result: smoke.SmokeResult, check: smoke.Check) -> None:
    result.checks = [c for c in result.checks if c.name != check.name] + [check]


def _unit_crashed(unit: str) -> bool:
    _, out = run(f"systemctl show {unit} -p ActiveState -p SubState -p NRestarts")
    return smoke.crashed(dict(line.split("=", 1) for line in out.splitlines() if "=" in line))


def check(target: Target, release: str, timeout_s: float, wait: bool = True,
          live: bool = False, settled: bool = False) -> smoke.SmokeResult:
    """settled: this run did not restart the instance, so its checks go first and the wait for /health
    only follows a failed health check (a converged host's smoke test is then one round of requests)."""
    api_key = os.environ.get(target.api_key_env) if target.api_key_env else None
    result = smoke.SmokeResult(host.name, target.name, target.served_name, target.tp, release)
    if target.headless and target.group:
        return worker_check(target, release, lambda: True, timeout_s)
    with tunnel(host, target.host, target.port) as t:

        def checked() -> list[smoke.Check]:
            if api_key:  # the key goes only to the instance's own process
                refused = smoke.holder_check(port_listeners(), probe_address(target.host), target.port,
                                             target.unit)
                if refused is not None:
                    return [refused]
            return smoke.run_checks(t.url, target.served_name, api_key, transport=t.transport)

        first = checked() if wait and settled else None
        if first is not None and smoke.stands(first):
            result.checks = first
        else:
            if wait:
                ready, waited = smoke.wait_healthy(t.url, timeout_s,
                                                   alive=lambda: not _unit_crashed(target.unit),
                                                   transport=t.transport)
                if not ready:
                    result.checks.append(smoke.Check("health", False, f"not ready after {waited:.0f} s"))
                    return result
                logger.info(f"[{host.name}] {target.unit} ready after {waited:.1f} s")
            result.checks = checked()
        if live and not smoke.withheld(result.checks):
            result.live = smoke.read_live(t.url, api_key=api_key, transport=t.transport)
    return result


def port_listeners() -> list[ListenerFacts] | None:
    """The host's TCP listeners with each one's unit, read now (roles/facts.py, as the fact reads
    them)."""
    ok, out = run(LISTEN_SH)
    return listeners_of(sections_of(out.splitlines())) if ok else None


def restored_targets(plan: HostPlan) -> list[Target]:
    """Instances as the restored configs on the host describe them (they may predate the inventory)."""
    keys = {i.name: i.secret_env.get("VLLM_API_KEY") for i in plan.instances}
    _, out = run(f"for f in {CONFIG_DIR}/*.yaml; do echo \"## $f\"; cat \"$f\"; done")
    targets = []
    for block in out.split("## ")[1:]:
        path, _, body = block.partition("\n")
        name = path.strip().rsplit("/", 1)[-1].removesuffix(".yaml")
        vals = dict(re.findall(r"^([a-z-]+): *(.+?)\s*$", body, re.M))
        group = f"{vals['master-addr']}:{vals.get('master-port', 29501)}" if "nnodes" in vals else None
        targets.append(Target(name, vals.get("served-model-name", name).strip("'\""),
                              vals.get("host", "127.0.0.1").strip("'\""), int(vals.get("port", 8000)),
                              keys.get(name, "VLLM_API_KEY"), int(vals.get("tensor-parallel-size", 1)),
                              group=group, headless=vals.get("headless") == "true"))
    return targets


# A node group's ("master-addr:port") verdict, decided by its head in this run (run.FleetRun.outcome):
# the workers' checks run at the same time in this process (pyinfra runs an operation on every host
# concurrently) and wait for it.


def _decide(plan: HostPlan, outcome: str) -> None:
    group = Target.of(plan.instances[0]).group if plan.instances else None
    if group is not None:
        current().outcome.setdefault(group, outcome)


def worker_check(target: Target, release: str, head_running: Callable[[], bool],
                 timeout_s: float) -> smoke.SmokeResult:
    """A worker has no API: it is as good as its head's smoke test through the group, which runs
    concurrently in this process; wait for that outcome (or for the head to drop out of the run)."""
    assert target.group is not None
    t0 = time.monotonic()
    outcomes = current().outcome
    while target.group not in outcomes and head_running() and time.monotonic() - t0 < timeout_s + 300:
        time.sleep(1)  # cooperative: pyinfra's CLI monkey-patches for gevent
    outcome = outcomes.get(target.group)
    alive = not _unit_crashed(target.unit)
    head = target.group.rsplit(":", 1)[0]
    result = smoke.SmokeResult(host.name, target.name, target.served_name, target.tp, release)
    if outcome is None and not head_running():
        # --limit without the head: the group cannot be smoke-tested from here
        result.checks.append(smoke.Check("worker", alive, f"unit {'running' if alive else 'FAILED'}; head "
                                         f"{head} not in this run, not smoke-tested"))
    else:
        result.checks.append(smoke.Check("worker", outcome == "ok" and alive,
                                         f"head {head}: {outcome or 'no result'}"))
    result.note = f"worker of the group at {target.group}"
    return result


def verify(plan: HostPlan, changed: Callable[[], bool], wait: bool = True, had_state: bool = True,
           restarted: frozenset[str] = frozenset(), live: bool = False) -> None:
    """Smoke every instance; keep the change (commit) or put the last known good back (rollback).

    A cluster's head is smoke-tested like any host, and its workers follow its outcome: they commit when
    it serves, and restore their own snapshot when it rolls back, so the group never mixes configs."""
    node = plan.instances[0].node if plan.instances else None
    if node is not None and not node.is_head:
        return verify_worker(plan, node, changed, had_state)
    try:
        _verify(plan, changed, wait, had_state, restarted, live)
    except SmokeFailed:
        _decide(plan, "failed")
        raise
    _decide(plan, "ok")


def _head_in_run(head: str) -> bool:
    h = state.inventory.get_host(head, None)
    return h is not None and h in state.activated_hosts and h not in state.failed_hosts


def verify_worker(plan: HostPlan, node: NodeRole, changed: Callable[[], bool], had_state: bool) -> None:
    inst = plan.instances[0]
    did_change = changed()
    result = worker_check(Target.of(inst), plan.release, lambda: _head_in_run(node.head),
                          plan.ready_timeout_s)
    result.changed = did_change
    outcome = current().outcome.get(node.store)
    result.note = f"worker of {node.cluster}, served through {node.head}"
    if result.ok:
        current().results.append(result)
        return
    message = (f"{host.name}: worker of cluster {node.cluster}: {result.failures()}\n"
               f"--- journal of {inst.unit}:\n{journal(inst.unit)}")
    if outcome == "rollback" and did_change:  # restored alongside its head, by the rollback operation
        raise ChangeFailed(message, [result], result.failures(), "", worker_of=node)
    current().results.append(result)
    raise SmokeFailed(message)


def _verify(plan: HostPlan, changed: Callable[[], bool], wait: bool, had_state: bool,
            restarted: frozenset[str] = frozenset(), live: bool = False) -> None:
    did_change = changed()  # at execution: a node group's restart is decided then, not in `restarted`
    results = [check(Target.of(i), plan.release, plan.ready_timeout_s, wait, live,
                     settled=not did_change and i.name not in restarted) for i in plan.instances]
    for inst, r in zip(plan.instances, results, strict=True):
        if r.ok and inst.name in restarted and not Target.of(inst).headless:
            r.checks.append(effective_check(inst))
            if inst.flags.get("middleware"):
                _replace(r, guard_check(plan, inst))
    failed = [r for r in results if not r.ok]
    for r in results:
        r.changed = did_change
    if not failed:
        current().results.extend(results)
        return
    reason = "; ".join(f"{r.instance}: {r.failures()}" for r in failed)
    tail = "\n".join(f"--- journal of vllm-{r.instance}.service:\n{journal(f'vllm-{r.instance}.service')}"
                     for r in failed)
    if not did_change:
        current().results.extend(results)
        raise SmokeFailed(f"{host.name}: smoke test failed (nothing was changed): {reason}\n{tail}")
    _decide(plan, "rollback")  # before the head restores, so its workers restore alongside
    raise ChangeFailed(f"{host.name}: smoke test failed after a change: {reason}", results, reason, tail)


NOTHING_TO_RESTORE = "nothing to roll back to"  # hoststate.py restore's words for a host never committed


def _stop_uncommitted(plan: HostPlan) -> str:
    """A node group's node with no committed state to return to: stopped, so it never serves (or holds
    a group's collective open for) a config the group did not commit."""
    units = " ".join(shlex.quote(i.unit) for i in plan.instances)
    ok, out = run(f"systemctl stop {units}")
    return ("stopped: the group's change failed and this node has no committed state to return to"
            if ok else f"rollback FAILED, and stopping it failed too: {out.strip()[-200:]}")


def roll_back(plan: HostPlan, failed: ChangeFailed) -> SmokeFailed:
    """Put the last known good state back after a failed change; the host's failure, to report."""
    grouped = failed.worker_of is not None or any(i.node for i in plan.instances)
    if failed.worker_of is not None:
        head = failed.worker_of.head
        ok, out = run(hoststate("restore current"))
        note = f"rolled back with head {head}" if ok else f"rollback FAILED: {out.strip()[-200:]}"
        if not ok and NOTHING_TO_RESTORE in out:
            note = _stop_uncommitted(plan)
        for r in failed.results:
            r.note = note
        current().results.extend(failed.results)
        return SmokeFailed(f"{failed}" if ok else f"{failed}\n{note}")
    t0 = time.monotonic()
    try:
        release, again = restore_and_check(plan, "current")
    except SmokeFailed as e:
        note = "no known-good state to roll back to"
        if grouped and NOTHING_TO_RESTORE in str(e):
            note = _stop_uncommitted(plan)
        for r in failed.results:
            r.note = note
        current().results.extend(failed.results)
        return SmokeFailed(f"{host.name}: change failed and could not be rolled back ({e}): {failed.reason}"
                           f"\n{failed.tail}" + (f"\n{note}" if note.startswith("stopped") else ""))
    took = time.monotonic() - t0
    return SmokeFailed(f"{host.name}: change failed and was rolled back to {release} "
                       f"({'serving again' if all(r.ok for r in again) else 'which also fails'}, "
                       f"rollback took {took:.0f} s): {failed.reason}\n{failed.tail}")


def restore_and_check(plan: HostPlan, which: str) -> tuple[str, list[smoke.SmokeResult]]:
    """Put a snapshot back (hoststate.py restore), then smoke-test what it describes."""
    ok, out = run(hoststate(f"restore {which}"))
    if not ok:
        raise SmokeFailed(out.strip().splitlines()[-1] if out.strip() else "restore failed")
    release = json.loads(out.strip().splitlines()[-1])["release"]
    targets = restored_targets(plan)
    results = [check(t, release, plan.ready_timeout_s) for t in targets]
    for t, r in zip(targets, results, strict=True):
        if t.group and not t.headless:  # a head: its workers' checks wait for this
            current().outcome.setdefault(t.group, "ok" if r.ok else "failed")
    for r in results:
        r.note = f"rolled back to {release}" + ("" if r.ok else " and STILL FAILING")
    current().results.extend(results)
    return release, results


def report(run: FleetRun) -> None:
    """The smoke table, once per run after pyinfra's own results; VLLM_FLEET_SMOKE_JSON also gets it as
    JSON (what `vllm-fleet rollout` reads)."""
    results = run.results
    if not results:
        return
    print("\n" + smoke.table(sorted(results, key=lambda r: (r.host, r.instance))), file=sys.stdout)
    out = os.environ.get("VLLM_FLEET_SMOKE_JSON")
    if out:
        with open(out, "w") as f:
            json.dump([r.as_dict() for r in results], f, indent=2)


def register_report() -> None:
    run = current()
    run.at_end("smoke", lambda: report(run))


def verify_op(plan: HostPlan, changed: Callable[[], bool], wait: bool = True, had_state: bool = True,
              restarted: frozenset[str] = frozenset(), live: bool = False, planned: bool = True,
              can_roll_back: bool = False) -> None:
    """restarted: instances this run restarts, whose start-up log is checked against the plan;
    live: also read what /metrics says now (`vllm-fleet status`); planned: whether collection already
    knows this run changes the host (what the proposed-changes table and `--dry` show); can_roll_back:
    this run may change the host, so a rollback operation follows the smoke test (and a failed smoke
    test is that operation's to act on: pyinfra shows it as an ignored error, the rollback as the
    host's failure)."""
    register_report()
    units = ", ".join(i.unit for i in plan.instances)
    smoked(name=f"smoke test {units}", plan=plan, changed=changed, wait=wait, had_state=had_state,
           restarted=restarted, live=live, planned=planned, _ignore_errors=can_roll_back)
    if can_roll_back:
        rolled_back(name=f"roll back {units} if its smoke test failed", plan=plan)


@operation(is_idempotent=True, _set_in_op=False)
def smoked(plan: HostPlan, changed: Callable[[], bool], wait: bool, had_state: bool,
           restarted: frozenset[str], live: bool, planned: bool) -> Generator[FunctionCommand, None, None]:
    """The smoke test as pyinfra should count it: a change's verdict is that change's command; on a
    host this run leaves alone the same checks only read, so they run inside the operation and it
    reports no change when they pass, and fails when they do not."""
    kwargs = {"plan": plan, "changed": changed, "wait": wait, "had_state": had_state,
              "restarted": restarted, "live": live}
    if not state.is_executing:  # pyinfra's change detection, before anything runs
        if planned:
            yield FunctionCommand(_verdict, (), kwargs)
        return
    if changed() or not had_state:
        yield FunctionCommand(_verdict, (), kwargs)
        return
    try:
        verify(plan, changed, wait=wait, had_state=had_state, restarted=restarted, live=live)
    except Exception as e:  # the host fails through the operation, with the same message
        current().verdicts[host.name] = e
        yield FunctionCommand(report_failure, (), {"error": e})


def _verdict(state: State, host: Host, **kwargs: Any) -> bool:
    """verify() as the operation's command: a failure is logged (no traceback) and kept for the
    rollback operation and the run's record (what a rollout reads)."""
    with ctx_host.use(host):
        try:
            verify(**kwargs)
        except Exception as e:
            current().verdicts[host.name] = e
            return report_failure(state, host, e)
    return True


def report_failure(state: State, host: Host, error: Exception) -> bool:
    current().fail(host.name, error)  # the rollback's own reason replaces it, if one follows
    host.log_styled(str(error), fg="red", log_func=logger.error)
    return False


@operation(_set_in_op=False)
def rolled_back(plan: HostPlan) -> Generator[FunctionCommand, None, None]:
    """A command only where the smoke test before it failed: the change is rolled back (or, where
    nothing changed, there is nothing to put back), and the host fails with the reason."""
    if state.is_executing and host.name in current().verdicts:
        yield FunctionCommand(_roll_back, (), {"plan": plan})


def _roll_back(state: State, host: Host, plan: HostPlan) -> bool:
    with ctx_host.use(host):
        failed = current().verdicts.pop(host.name)
        if not isinstance(failed, ChangeFailed):  # already reported by the smoke test
            host.log_styled("nothing to roll back: the smoke test failed on a host this run left alone",
                            fg="red", log_func=logger.error)
            return False
        logger.warning(f"[{host.name}] rolling back: {failed.reason}")
        error = roll_back(plan, failed)
        current().failures.pop(host.name, None)
        current().fail(host.name, error)
        host.log_styled(str(error), fg="red", log_func=logger.error)
    return False
