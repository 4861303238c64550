"""vllm-fleet: plan, stage, roll out, check and roll back vLLM on the hosts of a pyinfra inventory.

Each command is a pyinfra run of one of the package's deploys (`from vllm_fleet import deploy_vllm` in a
deploy file of your own does the same). `vllm-fleet explain` is the inventory's reference.
"""

from __future__ import annotations

import argparse
import sys


def _lab_root():
    """The source checkout holding the lab, when this package runs from one; None for an installed copy,
    whose command line then has no `lab` and `model` commands."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return root if (root / "fleetlab" / "__init__.py").is_file() else None


def _dev(module: str):
    """The lab and the tiny model are the checkout's dev part, never in the wheel."""
    import importlib

    root = _lab_root()
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(module)


def _lab(args: argparse.Namespace) -> int:
    lab = _dev("fleetlab")

    try:
        if args.lab_cmd == "up":
            lab.up(args.count, plain=args.plain)
        elif args.lab_cmd == "down":
            lab.down()
        elif args.lab_cmd == "rootfs":
            lab.preflight()
            lab.build_rootfs()
        elif args.lab_cmd == "halt":
            lab.halt(lab.LabHost(int(args.name.removeprefix("lab"))))
    except lab.LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 2
    return 0


def _pyinfra(inventory: str, deploy: str, limit: str | None, **how: bool) -> int:
    """Our commands are pyinfra runs, in this process (controller/runner.py): same connection settings,
    same inventory loader, no second SSH layer. deploy: the @deploy function (module.function), the
    name `pyinfra INVENTORY module.function` would run."""
    import importlib

    from vllm_fleet.controller import runner  # first: it sets gevent up as pyinfra's CLI does

    module, _, name = deploy.rpartition(".")
    func = getattr(importlib.import_module(module), name)
    try:
        inv = runner.load_inventory(inventory)
        hosts = runner.limit_hosts(inv, limit)
    except (RuntimeError, ValueError) as e:
        print(f"vllm-fleet: {e}", file=sys.stderr)
        return 2
    return 0 if runner.run(inv, func, hosts, **how).ok else 1


def _plan(args: argparse.Namespace) -> int:
    rc = _pyinfra(args.inventory, "vllm_fleet.roles.vllm.plan_vllm", args.limit)
    if rc or not args.diff:
        return rc
    # the deploy itself, dry, after pyinfra's change detection with diffs: the diff shown is the one a
    # deploy would apply, secrets hidden, and the hosts are left as they were
    return _pyinfra(args.inventory, "vllm_fleet.roles.vllm.deploy_vllm", args.limit,
                    dry=True, diff=True, detect_changes=True)


def _stage(args: argparse.Namespace) -> int:
    return _pyinfra(args.inventory, "vllm_fleet.roles.vllm.stage_vllm", args.limit)


def _rollout(args: argparse.Namespace, deploy: str = "rollout") -> int:
    from vllm_fleet.controller import rollout  # its runner sets gevent up first, as pyinfra's CLI does
    from vllm_fleet.roles import rollback, vllm

    func = vllm.deploy_vllm if deploy == "rollout" else rollback.rollback_vllm
    try:
        result = rollout.run(args.inventory, deploy=func, canary=args.canary, wave=args.wave,
                             max_unavailable=args.max_unavailable, limit=args.limit, what=deploy)
    except (ValueError, RuntimeError) as e:
        print(f"{args.cmd}: {e}", file=sys.stderr)
        return 2
    print("\n" + result.table())
    return 0 if result.ok else 1


def _rollback(args: argparse.Namespace) -> int:
    return _rollout(args, deploy="rollback")


def _status(args: argparse.Namespace) -> int:
    """With --watch, the whole status again every N seconds (each round is a fresh read-only run, so
    what it shows is never older than one round) until interrupted."""
    if not args.watch:
        return _pyinfra(args.inventory, "vllm_fleet.roles.vllm.check_vllm", args.limit)
    import time

    try:
        while True:
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            print("\033[2J\033[H", end="")  # clear the terminal, cursor home
            print(f"vllm-fleet status {args.inventory}, every {args.watch} s (Ctrl-C stops); at {started}")
            _pyinfra(args.inventory, "vllm_fleet.roles.vllm.check_vllm", args.limit)
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _targets(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from vllm_fleet.core.prometheus import OUTPUT_ENV

    out = Path(args.output).resolve()
    if not out.parent.is_dir():
        print(f"targets: {out.parent} is not a directory", file=sys.stderr)
        return 2
    os.environ[OUTPUT_ENV] = str(out)
    return _pyinfra(args.inventory, "vllm_fleet.roles.targets.write_vllm_targets", args.limit)


def _dashboards(args: argparse.Namespace) -> int:
    import json
    import os
    from pathlib import Path

    from vllm_fleet.roles.targets import DASHBOARDS_ENV

    out = Path(args.output).resolve()
    if not out.is_dir():
        print(f"dashboards: {out} is not a directory", file=sys.stderr)
        return 2
    os.environ[DASHBOARDS_ENV] = json.dumps({"output": str(out), "job": args.job, "down_for": args.down_for,
                                             "ttft_p99_target_s": args.ttft_p99_target})
    return _pyinfra(args.inventory, "vllm_fleet.roles.targets.write_vllm_dashboards", args.limit)


def _tune(args: argparse.Namespace) -> int:
    import json
    import os
    from pathlib import Path

    from vllm_fleet.core import tune
    from vllm_fleet.roles.tune import TUNE_ENV

    out = Path(args.output).resolve()
    workload = {"input_len": args.input_len, "output_len": args.output_len, "num_prompts": args.num_prompts,
                "request_rate": args.request_rate, "max_concurrency": args.max_concurrency}
    try:  # checked here too, so a typo costs no SSH connection
        tune.parse_grid(args.grid)
        tune.Workload(**workload)
        if args.latency not in tune.LATENCY_METRICS:
            raise tune.TuneError(f"--latency: {args.latency!r} is not one of "
                                 f"{', '.join(tune.LATENCY_METRICS)}")
    except tune.TuneError as e:
        print(f"tune: {e}", file=sys.stderr)
        return 2
    if not out.is_dir():
        print(f"tune: {out} is not a directory", file=sys.stderr)
        return 2
    from vllm_fleet.controller import runner

    try:
        names = [h.name for h in runner.load_inventory(args.inventory)]
    except (RuntimeError, ValueError) as e:
        print(f"vllm-fleet: {e}", file=sys.stderr)
        return 2
    if args.host not in names:  # one canary: not a group or a glob
        print(f"tune: --host {args.host!r} is not a host of {args.inventory} (hosts: {', '.join(names)})",
              file=sys.stderr)
        return 2
    os.environ[TUNE_ENV] = json.dumps({
        "host": args.host, "instance": args.instance, "grid": args.grid, "workload": workload,
        "latency": args.latency, "target_ms": args.target_ms, "output": str(out),
        "trial_port": args.trial_port})
    return _pyinfra(args.inventory, "vllm_fleet.roles.tune.tune_vllm", args.host)


def _preview(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vllm_fleet.controller import preview

    try:
        page = preview.page(Path(args.dashboard), args.prometheus, args.minutes)
    except (OSError, ValueError, preview.PreviewError) as e:
        print(f"preview: {e}", file=sys.stderr)
        return 1
    Path(args.output).write_text(page.html)
    print(f"preview: {page.panels} panels ({page.empty} without data) from {args.prometheus} written to "
          f"{args.output}")
    return 1 if page.empty and args.strict else 0


def _logs(args: argparse.Namespace) -> int:
    import os

    from vllm_fleet.core.logs import INSTANCE_ENV, LINES_ENV

    os.environ[LINES_ENV] = str(args.lines)
    if args.instance:
        os.environ[INSTANCE_ENV] = args.instance
    return _pyinfra(args.inventory, "vllm_fleet.roles.logs.tail_vllm_logs", args.limit)


def _explain(args: argparse.Namespace) -> int:
    from vllm_fleet.core import keydoc

    if not args.key:
        print("inventory keys (under each host's `vllm` data); `vllm-fleet explain KEY` says more:")
        print("\n".join("  " + k for k in keydoc.all_keys()))
        return 0
    try:
        print(keydoc.explain(args.key))
    except KeyError as e:
        print(f"explain: {e.args[0]}", file=sys.stderr)
        return 2
    return 0


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return n


def _model(args: argparse.Namespace) -> int:
    from pathlib import Path

    tiny_model = _dev("fleetlab.inventory").TINY_MODEL
    make_tiny_model = _dev("fleetlab.tinymodel").make_tiny_model
    dest = make_tiny_model(Path(args.dest) if args.dest else tiny_model)
    print(dest)
    return 0


# read by runner.limit_hosts, as pyinfra reads each --limit value
LIMIT_HELP = "comma-separated hosts, groups or globs of the inventory"


def main(argv: list[str] | None = None) -> int:
    from vllm_fleet import __version__

    p = argparse.ArgumentParser(prog="vllm-fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"vllm-fleet {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    if _lab_root() is not None:
        _lab_commands(sub)
    _commands(sub)
    args = p.parse_args(argv)
    return args.func(args)


def _lab_commands(sub) -> None:
    """The checkout's own commands: the lab and its tiny model."""
    lab_p = sub.add_parser("lab", help="local systemd hosts for the demo and the tests")
    lab_sub = lab_p.add_subparsers(dest="lab_cmd", required=True)
    up = lab_sub.add_parser("up", help="boot N lab hosts (idempotent)")
    up.add_argument("count", type=int, nargs="?", default=2, help="vLLM hosts: lab1 up")
    up.add_argument("--plain", type=int, default=0,
                    help="hosts without vLLM in the same inventory (lab8 down), as a fleet's database is")
    lab_sub.add_parser("down", help="remove every lab host and what it made")
    lab_sub.add_parser("rootfs", help="build the cached root file system only")
    halt = lab_sub.add_parser("halt", help="power a lab host off, keeping its disk")
    halt.add_argument("name")
    lab_p.set_defaults(func=_lab)

    model_p = sub.add_parser("model", help="models made locally (no hub downloads)")
    model_sub = model_p.add_subparsers(dest="model_cmd", required=True)
    tiny = model_sub.add_parser("tiny", help="write the tiny Llama test model")
    tiny.add_argument("dest", nargs="?")
    model_p.set_defaults(func=_model)


def _commands(sub) -> None:
    plan_p = sub.add_parser("plan", help="per host: GPUs, driver, variant and why, TP, dtype "
                                         "(changes nothing)")
    plan_p.add_argument("inventory")
    plan_p.add_argument("--limit", help=LIMIT_HELP)
    plan_p.add_argument("--diff", action="store_true",
                        help="then each file a deploy would change, as a diff (needs the deploy's secrets)")
    plan_p.set_defaults(func=_plan)

    stage_p = sub.add_parser("stage", help="per host: build the release from its lock, stage or fetch each "
                                           "model, validate each config; nothing live changes")
    stage_p.add_argument("inventory")
    stage_p.add_argument("--limit", help=LIMIT_HELP)
    stage_p.set_defaults(func=_stage)

    for name, func, helptext, canary in (
        ("rollout", _rollout, "canary, then waves; stops at the first failure", 1),
        ("rollback", _rollback, "roll hosts back one step, wave by wave", 0),
    ):
        r = sub.add_parser(name, help=helptext)
        r.add_argument("inventory")
        r.add_argument("--canary", type=int, default=canary,
                       help=f"hosts in the first wave (default {canary})")
        r.add_argument("--wave", default="1", help="hosts per later wave: N or P%% of the fleet (default 1)")
        r.add_argument("--max-unavailable", type=int, help="never more hosts changing at once than this")
        r.add_argument("--limit", help=LIMIT_HELP + "; waves keep inventory order")
        r.set_defaults(func=func)
    st = sub.add_parser("status", help="per host: release, config, service state, smoke test (read only)")
    st.add_argument("inventory")
    st.add_argument("--limit", help=LIMIT_HELP)
    st.add_argument("--watch", type=_positive, nargs="?", const=10, metavar="SECONDS",
                    help="refresh every SECONDS (default 10) until Ctrl-C")
    st.set_defaults(func=_status)

    from vllm_fleet.core.logs import DEFAULT_LINES
    from vllm_fleet.core.prometheus import DEFAULT_OUTPUT

    tg = sub.add_parser("targets", help="Prometheus file_sd targets of every network-reachable instance "
                                        "(read only)")
    tg.add_argument("inventory")
    tg.add_argument("--limit", help=LIMIT_HELP)
    tg.add_argument("--output", default=DEFAULT_OUTPUT,
                    help=f"file_sd JSON file, replaced atomically (default ./{DEFAULT_OUTPUT})")
    tg.set_defaults(func=_targets)

    db = sub.add_parser("dashboards", help="Grafana dashboard and Prometheus rules for the fleet's releases "
                                           "(read only)")
    db.add_argument("inventory")
    db.add_argument("--limit", help=LIMIT_HELP)
    db.add_argument("--output", default=".", help="directory for vllm-fleet-dashboard.json and "
                                                  "vllm-fleet-rules.yml (default .)")
    db.add_argument("--job", default="vllm", help="Prometheus job scraping the targets file (default vllm)")
    db.add_argument("--ttft-p99-target", type=float, default=2.0, metavar="SECONDS",
                    help="VllmTtftP99High fires above this (default 2)")
    db.add_argument("--down-for", help="VllmInstanceDown's `for:` (default: the slowest selected host's "
                                       "ready timeout + 60 s, so a restart does not page)")
    db.set_defaults(func=_dashboards)

    tu = sub.add_parser("tune", help="benchmark one instance over a grid of knobs (drained, stopped, "
                                     "restored) and write a report with a recommendation")
    tu.add_argument("inventory")
    tu.add_argument("--host", required=True, help="the canary host (one)")
    tu.add_argument("--instance", default="default", help="its instance (default: default)")
    tu.add_argument("--grid", action="append", required=True, metavar="KNOB=V1,V2,...",
                    help="e.g. max_num_batched_tokens=512,1024 (repeat for each knob; the points are "
                         "every combination, plus the inventory's own values)")
    tu.add_argument("--input-len", type=_positive, default=32, help="prompt tokens per request (default 32)")
    tu.add_argument("--output-len", type=_positive, default=16, help="output tokens per request (default 16)")
    tu.add_argument("--num-prompts", type=_positive, default=32, help="requests per point (default 32)")
    tu.add_argument("--request-rate", type=float, help="requests/s (default: all at once)")
    tu.add_argument("--max-concurrency", type=_positive, help="requests in flight at most (default: no cap)")
    tu.add_argument("--latency", default="p99_ttft_ms", help="the latency the target is on (default "
                                                            "p99_ttft_ms)")
    tu.add_argument("--target-ms", type=float, help="recommend only points at or under this latency")
    tu.add_argument("--trial-port", type=_positive, default=18000, help="the trial servers' loopback port")
    tu.add_argument("--output", default=".", help="directory for tune-report.html and tune-report.json")
    tu.set_defaults(func=_tune)

    pv = sub.add_parser("preview", help="the dashboard's panels drawn from a Prometheus, as one HTML page "
                                        "(where no Grafana is at hand)")
    pv.add_argument("dashboard", help="vllm-fleet-dashboard.json")
    pv.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    pv.add_argument("--minutes", type=_positive, default=15, help="time range drawn (default 15)")
    pv.add_argument("--output", default="vllm-fleet-dashboard.html")
    pv.add_argument("--strict", action="store_true", help="exit 1 when a panel has no data")
    pv.set_defaults(func=_preview)

    lg = sub.add_parser("logs", help="per host and instance: the journal's last lines (read only)")
    lg.add_argument("inventory")
    lg.add_argument("--limit", help=LIMIT_HELP)
    lg.add_argument("--instance", help="only this instance (default: every instance of the host)")
    lg.add_argument("--lines", type=_positive, default=DEFAULT_LINES,
                    help=f"lines per instance (default {DEFAULT_LINES})")
    lg.set_defaults(func=_logs)

    ex = sub.add_parser("explain", help="what an inventory key means, its default and where it comes from")
    ex.add_argument("key", nargs="?", help="e.g. max_num_seqs, flags.port, instances.api_key_env, version")
    ex.set_defaults(func=_explain)


if __name__ == "__main__":
    sys.exit(main())
