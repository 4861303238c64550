"""vLLM's own benchmark on each host against its local server, and a max-num-batched-tokens sweep that
changes nothing on the host.

The key never leaves the host: every benchmark client is a transient systemd unit that reads the
instance's 0600 env file itself (`systemd-run -p EnvironmentFile=`, parsed exactly as for the service),
and a shell inside it hands VLLM_API_KEY on as OPENAI_API_KEY, which `vllm bench serve` reads. The
controller needs no key for benching, argv holds only the literal `$VLLM_API_KEY`.

Sweep trials run as transient units of the same release and config, in the serving unit's sandbox (a
trial server is the same untrusted process), on a spare loopback port with the one flag overridden
(command-line flags win over `--config`), one at a time, stopped afterwards; the main unit keeps
serving, untouched, and its MainPID is compared before and after.
"""

from __future__ import annotations

import json
import os
import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from vllm_fleet.controller.run import current
from vllm_fleet.core import benchmark, render
from vllm_fleet.core.layout import STATE_DIR
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.roles import remote
from vllm_fleet.roles.hostplan import Refused, plan_without_secrets, this_host


def _rows(kind: str = "bench") -> list:
    """This run's table rows ("bench"), notes ("bench notes") and best trials ("bench best")."""
    return current().rows.setdefault(kind, [])


def _env_props(inst: InstancePlan) -> list[str]:
    """The instance's two env files (settings, then keys) hold its whole environment, as its unit
    reads them: values never go on a command line."""
    return ["-p", f"EnvironmentFile={inst.environment_path}", "-p", f"EnvironmentFile={inst.env_path}"]


def metrics_command(inst: InstancePlan, port: int) -> str:
    """/metrics of a trial server, with the instance's key when it has one (the key guard covers
    /metrics unless the inventory opens it): the header reaches curl on stdin, never in an argv."""
    inner = ('{ [ -n "${VLLM_API_KEY:-}" ] && printf "Authorization: Bearer %s\n" "$VLLM_API_KEY"; } | '
             f"curl -fsS -H @- http://127.0.0.1:{port}/metrics")
    return shlex.join(["systemd-run", "--quiet", "--pipe", "--wait", "--collect",
                       f"--unit=vllm-bench-metrics-{inst.name}", "-p", "User=vllm", "-p", "Group=vllm",
                       *_env_props(inst), "/bin/sh", "-c", inner])


def client_command(plan: HostPlan, inst: InstancePlan, port: int, s: benchmark.BenchSettings,
                   address: str = "127.0.0.1") -> str:
    """One `vllm bench serve` run as a transient unit, output piped back; the key only in its env."""
    args = benchmark.bench_args(s, f"http://{address}:{port}", inst.served_name, inst.model_dir)
    return bench_command(plan, inst, args)


def bench_command(plan: HostPlan, inst: InstancePlan, args: list[str]) -> str:
    """`vllm <args>` as a transient unit with the instance's environment, output piped back."""
    inner = ('OPENAI_API_KEY="$VLLM_API_KEY"; export OPENAI_API_KEY; unset VLLM_API_KEY; exec '
             + shlex.join([f"{plan.release_dir}/bin/vllm", *args]))
    return shlex.join(["systemd-run", "--quiet", "--pipe", "--wait", "--collect",
                       f"--unit=vllm-bench-client-{inst.name}", "-p", "User=vllm", "-p", "Group=vllm",
                       "-p", f"WorkingDirectory={STATE_DIR}", *_env_props(inst), "/bin/sh", "-c", inner])


# a trial server is stopped after its bench; one that outlives this (a controller gone mid-trial) is not
TRIAL_MAX_S = 3600


def trial_script(plan: HostPlan, inst: InstancePlan, flags: list[str], port: int, client: str,
                 kind: str = "bench") -> str:
    """Start a trial server with `flags` over the instance's config, wait for /health (or its death), run
    `client` against it, read its preemption counter, stop it. The traps stop it whatever ends the shell
    (a signal included), RuntimeMaxSec if the shell itself is gone, so a failed trial leaves nothing
    running. A port something else already listens on is refused: its /health would answer for the trial
    server and the bench would measure the wrong one."""
    unit = f"vllm-{kind}-trial-{inst.name}"
    serve = [f"{plan.release_dir}/bin/vllm", "serve", "--config", inst.config_path, "--host", "127.0.0.1",
             "--port", str(port), *flags]
    # the serving unit's own sandbox (rendered from it): a trial runs the same release on the same files
    sandbox = [a for prop in render.sandbox_properties(plan, inst) for a in ("-p", prop)]
    # stopped as the serving unit is (KillMode=mixed): SIGTERM to the API server, which stops its engine;
    # with the default KillMode the engine gets a second SIGTERM and sits out --shutdown-timeout
    start = shlex.join(["systemd-run", "--quiet", "--collect", f"--unit={unit}", "-p", "User=vllm",
                        "-p", "Group=vllm", "-p", f"WorkingDirectory={STATE_DIR}", "-p", "KillMode=mixed",
                        "-p", f"RuntimeMaxSec={TRIAL_MAX_S + plan.ready_timeout_s}", *sandbox,
                        *_env_props(inst), *serve])
    return "\n".join([
        f"systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null",
        f"if ss -Hltn 'sport = :{port}' | grep -q .; then echo '## port busy'; ss -Hltnp 'sport = :{port}'; "
        "exit 0; fi",
        f"trap 'systemctl stop {unit} 2>/dev/null' EXIT",
        "trap 'exit 1' HUP INT TERM PIPE",
        start,
        f"i=0; until curl -fsS -o /dev/null http://127.0.0.1:{port}/health; do",
        f"  systemctl is-active -q {unit} || {{ echo '## died'; journalctl -u {unit} -n 15 --no-pager -o cat;"
        " exit 0; }",
        f"  i=$((i+2)); [ $i -gt {plan.ready_timeout_s} ] && {{ echo '## timeout'; exit 0; }}",
        "  sleep 2",
        "done",
        "echo '## bench'",
        client + " 2>&1",
        "echo '## metrics'",
        f"{metrics_command(inst, port)} | grep '^vllm:num_preemptions' || true",
    ])


def sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {"": []}
    key = ""
    for line in text.splitlines():
        if line.startswith("## "):
            key = line[3:].strip()
            out[key] = []
        else:
            out[key].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def address(inst: InstancePlan) -> str:
    """Where the local server answers, as a URL's host: loopback unless it is bound to one specific
    address (an IPv6 one in brackets)."""
    if inst.host in ("0.0.0.0", "::", "127.0.0.1", "localhost"):
        return "127.0.0.1"
    return f"[{inst.host}]" if ":" in inst.host else inst.host


def main_pid(unit: str) -> str:
    ok, out = remote.run(f"systemctl show -p MainPID --value {unit}")
    return out.stdout.strip() if ok else "?"


def _run(plan: HostPlan, s: benchmark.BenchSettings) -> None:
    rows, notes, best = _rows(), _rows("bench notes"), _rows("bench best")
    for n, inst in enumerate(plan.instances):
        if inst.node is not None and not inst.node.is_head:
            notes.append(f"{host.name}/{inst.name}: a headless node of cluster {inst.node.cluster}, "
                         "benched through its head")
            continue
        pid_before = main_pid(inst.unit)
        ok, out = remote.run(client_command(plan, inst, inst.port, s, address(inst)) + " 2>&1")
        try:
            result = benchmark.parse(out.output)
            note = "" if result.ok else "requests failed"
        except benchmark.BenchError as e:
            result, note = None, str(e).splitlines()[0]
        rows.append(benchmark.row(host.name, inst.name, "serving (as deployed)", result, note))
        if not ok and result is None:
            logger.warning(f"[{host.name}] vllm bench serve failed:\n{out.output[-2000:]}")
        max_len = inst.flags.get("max-model-len")
        trials = benchmark.sweep(int(max_len), s.sweep_multiples, s.sweep_chunked) if max_len else []
        if not max_len and (s.sweep_multiples or s.sweep_chunked):
            notes.append(f"{host.name}/{inst.name}: no max_model_len in the inventory, sweep skipped")
        if inst.node is not None and trials:
            # a trial of a node group would need a second group on every node
            notes.append(f"{host.name}/{inst.name}: cluster {inst.node.cluster}, sweep skipped")
            trials = []
        outcomes = []
        for trial in trials:
            port = s.trial_port + n
            client = client_command(plan, inst, port, s)
            _, out = remote.run(trial_script(plan, inst, trial.flags(), port, client))
            parts = sections(out.output)
            if "bench" not in parts:
                err = ("port busy" if "port busy" in parts else "did not start" if "died" in parts
                       else "not ready in time")
                why = parts.get("died", out.output)[-1500:]
                logger.warning(f"[{host.name}] trial {trial.label}: {err}\n{why}")
                outcomes.append(benchmark.TrialOutcome(trial, None, error=err))
            else:
                try:
                    r = benchmark.parse(parts["bench"])
                    outcomes.append(benchmark.TrialOutcome(
                        trial, r, benchmark.preemptions(parts.get("metrics", ""))))
                except benchmark.BenchError as e:
                    outcomes.append(benchmark.TrialOutcome(trial, None, error=str(e).splitlines()[0]))
            o = outcomes[-1]
            rows.append(benchmark.row(host.name, inst.name, f"trial max-num-batched-tokens {trial.label}",
                                       o.result, o.note))
        pid_after = main_pid(inst.unit)
        notes.append(f"{host.name}/{inst.name}: {inst.unit} MainPID {pid_before} before, {pid_after} after: "
                      + ("untouched" if pid_before == pid_after else "CHANGED"))
        if trials:
            top = benchmark.best(outcomes)
            if top is None or top.result is None:
                best.append(f"{host.name}/{inst.name}: no usable trial")
            else:
                best.append(f"{host.name}/{inst.name}: best max-num-batched-tokens {top.trial.label} "
                             f"({top.result.output_throughput:.1f} output tok/s); to keep it, add to the "
                             f"instance's vllm flags: {json.dumps(top.trial.inventory())}")


def _report(rows: list, notes: list, best: list) -> None:
    if not rows:
        return
    print("\n" + benchmark.table(sorted(rows, key=lambda r: (r[0], r[1]))))
    for line in notes + best:
        print(line)
    if os.environ.get("VLLM_FLEET_BENCH_APPLY") == "1":
        print("VLLM_FLEET_BENCH_APPLY=1: not implemented; no host was changed "
              "(add the line above to the inventory and deploy)")


@deploy("vLLM bench")
def bench_vllm() -> None:
    """``vllm bench serve`` against each host's own instance, then a sweep of max-num-batched-tokens on
    transient trial servers; nothing deployed changes. The settings are checked while collecting, so a
    bad one stops the run before any host is benched.

    Host data read: ``vllm``, ``vllm_defaults``, ``vllm_bench`` (the settings; ``VLLM_FLEET_BENCH_*``
    variables give the same settings fleet-wide, e.g. ``VLLM_FLEET_BENCH_NUM_PROMPTS``).

    **Example:**

    .. code:: python

        from vllm_fleet import bench_vllm

        bench_vllm()
    """
    spec = this_host(check_secrets=False)
    if spec is None:
        return
    plan = plan_without_secrets(spec)
    try:
        s = benchmark.settings(host.data.get("vllm_bench"), os.environ)
    except benchmark.BenchError as e:
        raise Refused(f"{host.name}: {e}") from None
    rows, notes, best = _rows(), _rows("bench notes"), _rows("bench best")
    current().at_end("bench", lambda: _report(rows, notes, best))
    python.call(name="vllm bench serve" + (" + max-num-batched-tokens sweep"
                                           if s.sweep_multiples or s.sweep_chunked else ""),
                function=_run, plan=plan, s=s)
