"""`vllm-fleet` command line: thin dispatch onto the modules that do the work."""

from __future__ import annotations

import argparse
import sys


def _lab(args: argparse.Namespace) -> int:
    from fleet import lab

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


def _pyinfra(inventory: str, deploy: str, extra: list[str]) -> int:
    """Our commands are pyinfra runs: same connection settings, same inventory, no second SSH layer."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    exe = Path(sys.executable).parent / "pyinfra"
    return subprocess.run([str(exe), "-y", *extra, inventory, str(root / "deploys" / deploy)],
                          cwd=root).returncode


def _plan(args: argparse.Namespace) -> int:
    return _pyinfra(args.inventory, "plan.py", ["--limit", args.limit] if args.limit else [])


def _rollout(args: argparse.Namespace, deploy: str = "vllm.py") -> int:
    from fleet import rollout

    try:
        result = rollout.run(args.inventory, deploy=deploy, canary=args.canary, wave=args.wave,
                             max_unavailable=args.max_unavailable, limit=args.limit)
    except (ValueError, RuntimeError) as e:
        print(f"{args.cmd}: {e}", file=sys.stderr)
        return 2
    print("\n" + result.table())
    return 0 if result.ok else 1


def _rollback(args: argparse.Namespace) -> int:
    return _rollout(args, deploy="rollback.py")


def _status(args: argparse.Namespace) -> int:
    return _pyinfra(args.inventory, "smoke.py", ["--limit", args.limit] if args.limit else [])


def _model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fleet.lab_inventory import TINY_MODEL
    from fleet.tinymodel import make_tiny_model

    dest = make_tiny_model(Path(args.dest) if args.dest else TINY_MODEL)
    print(dest)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm-fleet", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

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

    plan_p = sub.add_parser("plan", help="per host: GPUs, driver, variant and why, TP, dtype "
                                         "(changes nothing)")
    plan_p.add_argument("inventory")
    plan_p.add_argument("--limit")
    plan_p.set_defaults(func=_plan)

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
        r.add_argument("--limit", help="comma-separated hosts, in inventory order")
        r.set_defaults(func=func)
    st = sub.add_parser("status", help="per host: release, config, service state, smoke test (read only)")
    st.add_argument("inventory")
    st.add_argument("--limit")
    st.set_defaults(func=_status)

    model_p = sub.add_parser("model", help="models made locally (no hub downloads)")
    model_sub = model_p.add_subparsers(dest="model_cmd", required=True)
    tiny = model_sub.add_parser("tiny", help="write the tiny Llama test model")
    tiny.add_argument("dest", nargs="?")
    model_p.set_defaults(func=_model)

    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
