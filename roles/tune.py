"""`vllm-fleet tune`: measure one canary instance over a grid of knobs, then recommend a setting.

The instance is taken out of service for the run: drained in every door that fronts it, its unit
stopped (on a GPU its memory is what the trial servers need), then each point of the grid runs as a
transient trial server (the serving unit's release, config, environment and sandbox, with the point's
flags on the command line: command-line flags win over `--config`) benchmarked by vLLM's own
`vllm bench serve`, one at a time. Whatever happens, the unit is started again with the config it had
(nothing on the host is edited; the config's sha256 is compared), and it goes back into rotation once
it answers /health. A unit that does not come back fails the run and stays drained, as a failed deploy
does. If the controller itself is gone mid-run, a timer armed on the host before each trial starts the
unit again (it stays drained: readying it is a person's or the next deploy's call). The inventory is
never edited: the report carries the change as a diff.

The run changes the host (it stops and starts a unit), so it holds the host lease like a deploy.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.operations import python

from vllm_fleet.controller.run import current
from vllm_fleet.core import benchmark, flags, tune
from vllm_fleet.core.layout import SYSTEMD_DIR
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.roles import lb, lease, remote
from vllm_fleet.roles.bench import TRIAL_MAX_S, address, bench_command, main_pid, sections, trial_script
from vllm_fleet.roles.hostplan import Refused, plan_without_secrets, this_host
from vllm_fleet.roles.targets import write_atomically

TUNE_ENV = "VLLM_FLEET_TUNE"  # JSON from the CLI: host, instance, grid, workload, latency, target_ms, output
REPORT_HTML, REPORT_JSON = "tune-report.html", "tune-report.json"


def _settings() -> dict:
    raw = os.environ.get(TUNE_ENV)
    if not raw:
        raise Refused(f"{host.name}: {TUNE_ENV} is not set: run `vllm-fleet tune`")
    return json.loads(raw)


def _fingerprint(inst: InstancePlan) -> str:
    """The instance's config, unit and environment files as they are on the host: equal before and after
    means the instance was restored, not rewritten."""
    paths = [inst.config_path, f"{SYSTEMD_DIR}/{inst.unit}", inst.environment_path]
    ok, out = remote.run("sha256sum " + " ".join(shlex.quote(p) for p in paths) + " 2>&1")
    return out.stdout.strip() if ok else f"unreadable: {out.output.strip()[-300:]}"


def _restart_back(plan: HostPlan, inst: InstancePlan) -> str:
    """Start the unit again and wait for /health; "" once it answers, else why not."""
    script = "\n".join([
        f"systemctl start {inst.unit} || {{ echo 'did not start'; exit 1; }}",
        f"i=0; until curl -fsS -o /dev/null http://{address(inst)}:{inst.port}/health; do",
        f"  systemctl is-active -q {inst.unit} || {{ echo 'exited while starting'; exit 1; }}",
        f"  i=$((i+2)); [ $i -gt {plan.ready_timeout_s} ] && "
        f"{{ echo 'not healthy in {plan.ready_timeout_s} s'; exit 1; }}",
        "  sleep 2",
        "done",
    ])
    ok, out = remote.run(script)
    return "" if ok else f"{inst.unit} {out.output.strip()[-600:] or 'failed to start'}"


def _trial(plan: HostPlan, inst: InstancePlan, point: tune.TunePoint, workload: tune.Workload,
           port: int) -> tune.Outcome:
    args = ["bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--model",
            inst.served_name, "--tokenizer", inst.model_dir, "--ignore-eos", *tune.workload_args(workload)]
    client = bench_command(plan, inst, args)
    _, out = remote.run(trial_script(plan, inst, point.flags(plan.vllm_version), port, client, "tune"))
    parts = sections(out.output)
    if "bench" not in parts:
        err = ("port busy" if "port busy" in parts else "did not start" if "died" in parts
               else "not ready in time")
        logger.warning(f"[{host.name}] tune {point.label}: {err}\n{parts.get('died', out.output)[-1500:]}")
        return tune.Outcome(point, None, err)
    try:
        return tune.Outcome(point, benchmark.parse(parts["bench"]))
    except benchmark.BenchError as e:
        return tune.Outcome(point, None, str(e).splitlines()[0])


def _restorer(inst: InstancePlan) -> str:
    return f"vllm-tune-restore-{inst.name}"


def _arm(plan: HostPlan, inst: InstancePlan) -> None:
    """A dead man's switch on the host: if this controller is gone (killed, its connection cut) before
    the next trial, the host starts the instance again by itself. Re-armed before every trial."""
    unit = _restorer(inst)
    budget = 2 * plan.ready_timeout_s + TRIAL_MAX_S
    remote.run(f"systemctl stop {unit}.timer 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; "
               + shlex.join(["systemd-run", "--quiet", "--collect", f"--unit={unit}",
                             f"--on-active={budget}s", "systemctl", "start", inst.unit]))


def _disarm(inst: InstancePlan) -> None:
    remote.run(f"systemctl stop {_restorer(inst)}.timer 2>/dev/null; true")


def _drained_before(inst: InstancePlan) -> bool:
    """An instance an operator had drained stays drained after the tune."""
    mine = {s.listener for _, servers in lb.fronting(host.name) for s in servers if s.instance == inst.name}
    return any(entry.split(": ", 1)[1].split(" ", 1)[0] in mine for entry in lb.not_ready())


def _run(state: State, host: Host, plan: HostPlan, inst: InstancePlan, points: list[tune.TunePoint],
         workload: tune.Workload, port: int, latency: str, record: dict) -> bool:
    """pyinfra passes (state, host) to a callback that takes them; False fails the host."""
    record["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    t0 = time.monotonic()
    record["pid_before"], record["files_before"] = main_pid(inst.unit), _fingerprint(inst)
    _, state_out = remote.run(f"systemctl show -p ActiveState --value {inst.unit}")
    # restored to what it was: an instance someone had stopped is not started by a tune (one still
    # loading its model counts as running)
    was_active = state_out.stdout.strip() in ("active", "activating", "reloading")
    keep_drained = _drained_before(inst)
    outcomes: list[tune.Outcome] = record["outcomes"]
    why, stopped = "", False
    try:
        if was_active:
            lb.drain(inst.name)
            _arm(plan, inst)
            stopped, _ = remote.run(f"systemctl stop {inst.unit}")
            if not stopped:
                record["error"] = f"{inst.unit} could not be stopped"
                return False
        for i, point in enumerate(points, 1):
            if was_active:
                _arm(plan, inst)
            outcomes.append(_trial(plan, inst, point, workload, port))
            print(tune.progress_line(i, len(points), outcomes[-1], latency), flush=True)
    finally:
        if was_active:
            why = _restart_back(plan, inst)
            _disarm(inst)
        record["wall_s"] = time.monotonic() - t0
        record["pid_after"], record["files_after"] = main_pid(inst.unit), _fingerprint(inst)
        if why:
            record["error"] = f"{why} (left drained)"
            host.log_styled(f"tune: {record['error']}", fg="red", log_func=logger.error)
        elif was_active and not keep_drained:
            lb.ready(inst.name)  # also when the drain itself failed part-way: back where it was
    if why:
        return False
    if record["files_after"] != record["files_before"]:
        record["error"] = "the instance's files changed during the run"
        return False
    if not any(o.usable for o in outcomes):
        record["error"] = "no point gave a usable result"
        return False
    return True


def _report(settings: dict, plan: HostPlan, inst: InstancePlan, workload: tune.Workload,
            skipped: list[tuple[str, str]], current_values: dict, record: dict) -> None:
    outcomes: list[tune.Outcome] = record["outcomes"]
    latency, target = settings["latency"], settings.get("target_ms")
    if not outcomes:
        print(f"\ntune: no trial ran on {host.name}/{inst.name}: {record.get('error', 'see above')}")
        return
    rec = tune.recommend(outcomes, latency, target)
    diff = (tune.inventory_diff(plan.host, inst.name, current_values, rec.chosen.point)
            if rec and not rec.keep else "")
    note = ("lab: vLLM's CPU build on this machine's CPU, tiny model; not a GPU's figures"
            if plan.variant == "cpu" else f"{plan.variant} build")
    out = Path(settings["output"])
    html = tune.report_html(plan.host, inst.name, inst.served_name, plan.release, workload, latency, target,
                            outcomes, rec, diff, record["started"], record.get("wall_s", 0.0), note, skipped)
    facts = tune.summary(plan.host, inst.name, inst.served_name, plan.release, workload, latency, target,
                         outcomes, rec, skipped, record.get("wall_s"))
    facts["restored"] = {k: record.get(k) for k in ("pid_before", "pid_after", "files_before", "files_after")}
    write_atomically(out / REPORT_HTML, html)
    write_atomically(out / REPORT_JSON, json.dumps(facts, indent=2) + "\n")
    print("\n" + tune.table(outcomes, latency, rec))
    for label, why in skipped:
        print(f"skipped {label}: {why}")
    if rec:
        print(rec.text)
    elif any(o.usable for o in outcomes):
        print(f"tune: no point meets the target ({latency} <= {target:g} ms); the inventory's values stay")
    else:
        print("tune: no point gave a usable result; the inventory's values stay")
    if diff:
        print(diff)
    same = record.get("files_after") == record.get("files_before")
    back = ("left stopped, as it was" if record.get("pid_before") == "0" else
            f"restarted back (MainPID {record.get('pid_before')} -> {record.get('pid_after')})")
    print(f"tune: {inst.unit} {back}, its files {'unchanged' if same else 'CHANGED'}; "
          f"{len(outcomes)} points in "
          f"{record.get('wall_s', 0):.0f} s; report {out / REPORT_HTML}")


@deploy("vLLM tune")
def tune_vllm() -> None:
    """Benchmark one instance over a grid of knobs on transient trial servers while it is drained and
    stopped, restore it, and write a report with the recommended setting. The grid and workload are
    checked while collecting, so a bad one stops the run before the instance is touched.

    Host data read: ``vllm``, ``vllm_defaults``, ``vllm_lb`` (the doors it is drained in). Environment:
    ``VLLM_FLEET_TUNE`` (set by ``vllm-fleet tune``).

    **Example:**

    .. code:: python

        from vllm_fleet import tune_vllm

        tune_vllm()
    """
    settings = _settings()
    if host.name != settings["host"]:
        return
    spec = this_host(check_secrets=False)
    if spec is None:
        raise Refused(f"{host.name}: not a vLLM host")
    lease.take("tune")  # before any fact: what it plans from is not mid-change
    lease.confirm_op()
    plan = plan_without_secrets(spec)
    inst = next((i for i in plan.instances if i.name == settings["instance"]), None)
    if inst is None:
        raise Refused(f"{host.name}: no instance {settings['instance']!r} (it has "
                      f"{', '.join(i.name for i in plan.instances)})")
    if inst.node is not None:
        raise Refused(f"{host.name}/{inst.name}: part of cluster {inst.node.cluster}: tune a single-host "
                      "instance")
    port = int(settings["trial_port"])
    taken = {i.port: i.name for i in plan.instances}
    if not 0 < port < 65536 or port in taken:
        raise Refused(f"{host.name}/{inst.name}: --trial-port {port}: "
                      + (f"instance {taken[port]} serves there" if port in taken else "not a TCP port"))
    platform = "cpu" if plan.variant == "cpu" else "cuda"
    try:
        grid = tune.parse_grid(settings["grid"], platform)
        lacking = [k for k in grid if not flags.accepted_by(k, plan.vllm_version, platform)]
        if lacking:
            raise tune.TuneError(f"--grid {', '.join(lacking)}: vLLM {plan.vllm_version} has no such flag")
        workload = tune.Workload(**settings["workload"])
        now = tune.current_values(inst.flags)
        points, skipped = tune.points(grid, now)
        if settings["latency"] not in tune.LATENCY_METRICS:
            raise tune.TuneError(f"--latency: {settings['latency']!r} is not one of "
                                 f"{', '.join(tune.LATENCY_METRICS)}")
    except tune.TuneError as e:
        raise Refused(f"{host.name}/{inst.name}: {e}") from None
    record: dict = {"outcomes": []}
    current().at_end("tune", lambda: _report(settings, plan, inst, workload, skipped, now, record))
    python.call(name=f"tune {inst.name}: {len(points)} points (drained and stopped meanwhile)", function=_run,
                plan=plan, inst=inst, points=points, workload=workload, port=port,
                latency=settings["latency"], record=record)
