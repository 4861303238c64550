"""What collecting the vLLM deploy costs the controller per host, with no host at all, in one run.

  python bench/collect_cost.py [--hosts 16] [--runs 5]

The deploy is collected for N never-deployed hosts whose facts are given (the decision tests' facts,
tests/unit/test_deploy_decisions.py), so no SSH and no host-side work is timed: only pyinfra's
operation calls and the deploy's own planning. Twice: in pyinfra's CLI mode (what `pyinfra` and
`vllm-fleet` run: each operation call reads the call stack to order operations) and in its API mode
(operations ordered by a per-host count). Prints the median milliseconds per host of each and the
operations per host; the fleet-scale figure (bench/fleet_scale.py) pays the CLI-mode cost per host.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import tempfile

    import pyinfra
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.host import Host
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

    from fleetlab.inventory import lab_vllm
    from fleetlab.tinymodel import make_tiny_model
    from tests.unit.test_deploy_decisions import FRESH, KEY, Facts
    from vllm_fleet.roles.vllm import deploy_vllm

    os.environ.setdefault("VLLM_API_KEY", KEY)
    model = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny-llama")
    facts = Facts(FRESH)
    Host.get_fact = lambda self, cls, *a, **kw: facts.get(cls.__name__, kw)  # type: ignore[method-assign]

    def collect(cli: bool) -> tuple[float, int]:
        inventory = Inventory(([f"host{i:02d}" for i in range(args.hosts)], {}))
        for h in inventory:
            h.data.vllm = {**lab_vllm(1), "model": {"name": "tiny-llama", "path": str(model)}}
        state = State(inventory, Config())
        for h in inventory:
            state.activate_host(h)
        state.set_stage(StateStage.Prepare)
        pyinfra.is_cli = cli
        t0 = time.perf_counter()
        with ctx_state.use(state), ctx_inventory.use(inventory), ctx_config.use(state.config):
            for h in inventory:
                with ctx_host.use(h):
                    deploy_vllm()
        took = time.perf_counter() - t0
        return took / args.hosts * 1000, len(state.ops[inventory.get_host("host00")])

    collect(False)  # warm: imports, the model's digest, templates
    cli = statistics.median(collect(True)[0] for _ in range(args.runs))
    api, ops = statistics.median(collect(False)[0] for _ in range(args.runs)), collect(False)[1]
    print(f"\ncollection of the vLLM deploy, {args.hosts} fresh hosts, median of {args.runs} runs "
          f"({os.cpu_count()} cores), no SSH:")
    print(f"  operations per host:            {ops}")
    print(f"  pyinfra's CLI mode (stack):     {cli:6.1f} ms per host")
    print(f"  pyinfra's API mode (count):     {api:6.1f} ms per host")
    print(f"  the call-stack ordering:        {cli - api:6.1f} ms per host "
          f"({(cli - api) / ops:.2f} ms per operation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
