"""Controller scale: the controller's decision work per host for a fleet of 10, 100 and 1000 hosts.

  python bench/controller_scale.py [--sizes 10,100,1000] [--runs 5] [--collect [--collect-runs 3]]

No host and no SSH: every host's facts are given. For each fleet size N an inventory of N vLLM hosts is
built as plain host data in the lab's shape (fleetlab/inventory.py `lab_vllm`), a mix per ten hosts:

  4 CPU hosts serving the tiny model staged from the controller (fleetlab.tinymodel, in a temp dir),
  2 CPU hosts forming a node group (`vllm.cluster`, split tensor, addressed by their ssh_hostname),
  2 L40S, 1 H100 and 1 RTX 4080 SUPER hosts serving a `host_path` model whose config.json is a fact,

fleet-wide `vllm_defaults` as pyinfra group data, and one load balancer host (`vllm_lb`, not a vLLM
host) in front of every stand-alone host. The GPU facts are the NvidiaGpus fact's own parser over the
real captured nvidia-smi outputs in tests/fixtures/nvidia (query csv, `nvidia-smi -q` and the driver);
the VllmHost fact is its parser over a never-deployed host's output (tests/unit/test_deploy_decisions.py
FRESH) with each host's own address.

What is timed is what each host's collection decides, through roles/hostplan.py's own functions, in
the deploy's order (roles/vllm.py `_prepared` and `_deploy_vllm`), on one pyinfra State per run so the
once-per-run work is paid once per run, as in a deploy:

  validate hostplan.inventory_specs(), the first call of the run: the whole inventory validated
           (spec.parse_inventory) and its node groups resolved (cluster.resolve), once per run; shown
           per host of the fleet, like the others
  spec     hostplan.inventory_specs(), each host's call (as this_host makes it, its login check
           aside): this host's spec, and the check that the inventory's secret variables are set
  facts    hostplan.host_facts(): HostFacts from the given facts
  plan     hostplan.plan_for(): the model's config and size (staged: read on the controller; host_path:
           the HostModel fact), then plan.plan_host
  lb       roles.lb.fronting(host): the balancers validated once per run, then this host's servers in
           each (the deploy asks it before its restart, for the drain, and for the ready step)
  render   core/render.py: unit, 0600 env file, environment file, serve config and watchdog units of
           every instance

STUBBED FACT LAYER: pyinfra's `Host.get_fact` is replaced, for the duration of each run, by a lookup in
the given answers (VllmHost, NvidiaGpus, HostModel; LoginAccess and Manifest for --collect), and
`Host.connect` by a refusal; nothing else of pyinfra or of the deploy is
stubbed. With `--collect` the whole `deploy_vllm` is also collected through pyinfra's API (operations
included) for each size, over the same stubbed facts, with the release's lock given
(`install.lock_of`, which would otherwise resolve it over the network) — the path bench/collect_cost.py
measures for one size.

Timed with time.perf_counter, each size `--runs` times, the sizes taking turns; each block of ten
hosts (one block of the mix) keeps its fastest time over the runs, so the figures of every size are
minimums over the same number of equally short samples, even on a busy machine (see `measure`). Prints,
per size, the total, the seconds per host and each step's milliseconds per host, the ratio of the
per-host time at the largest size to the smallest (goal <= 1.2), and each step whose per-host cost
grew by more than that. About 15 s on 2 cores; `--collect` adds about a minute.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.2
STEPS = ("validate", "spec", "facts", "plan", "lb", "render")
KEY_VAR = "VLLM_API_KEY"

# (query csv, nvidia-smi -q) captures of one GPU each, from tests/fixtures/nvidia (ue-*: nvidia_gpu_exporter)
GPU_CAPTURES = {
    "l40s": "ue-nvidia-l40s-595.80-idle.txt",
    "h100": "ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt",
    "rtx4080s": "ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt",
}
# one block of ten hosts: the mix repeated to the fleet's size
BLOCK = ("cpu", "cpu", "cpu", "cpu", "node", "node", "l40s", "l40s", "h100", "rtx4080s")
HOST_PATH = "/srv/models/tiny-llama"


def framed_nvidia(capture_name: str) -> list[str]:
    """What the NvidiaGpus fact's command prints on a host with this captured GPU (its sections framed
    as the fact's command frames them), built from the capture's query csv, -q output and driver."""
    from tests.nvidia_captures import capture
    from vllm_fleet.roles.nvidia_facts import MARK

    head, *rows = [ln for ln in capture(f"query_csv/{capture_name}").splitlines() if ln.strip()]
    columns = [c.split(" [")[0] for c in head.split(", ")]
    fields = "index,uuid,name,memory.total,compute_cap,pci.bus_id,mig.mode.current"
    picked, driver = [], ""
    for row in rows:
        cells = [c.removesuffix(" MiB") for c in row.split(", ")]
        picked.append(", ".join(cells[columns.index(f)] for f in fields.split(",")))
        driver = cells[columns.index("driver_version")]
    return [f"{MARK} begin gpus", f"{MARK} fields {fields}", *picked, f"{MARK} rc 0", f"{MARK} end gpus",
            f"{MARK} begin health", *capture(f"smi_q/{capture_name}").splitlines(), f"{MARK} rc 0",
            f"{MARK} end health", f"{MARK} begin xid", f"{MARK} source journal", f"{MARK} end xid",
            f"{MARK} begin driver", f"{MARK} source nvidia-smi", driver, f"{MARK} end driver"]


def fleet(n: int, model: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]],
                                        dict[str, str]]:
    """(vLLM hosts, other hosts, host -> kind): N vLLM hosts in the lab's data shape, and a load balancer."""
    from fleetlab.inventory import lab_cluster_vllm, lab_vllm

    login = {"ssh_user": "deploy", "_sudo": True, "ssh_strict_host_key_checking": "yes"}
    hosts, kinds, standalone = [], {}, []
    names = [f"host{i:04d}" for i in range(n)]
    for i, name in enumerate(names):
        kind = BLOCK[i % len(BLOCK)]
        data = {**login, "ssh_hostname": f"10.{20 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"}
        if kind == "cpu":
            vllm = {**lab_vllm(i), "model": {"name": "tiny-llama", "path": str(model)}}
            vllm["flags"] = {**vllm["flags"], "host": "0.0.0.0"}
        elif kind == "node":  # two hosts in a row serve one model together
            pair = names[i - i % 2: i - i % 2 + 2]
            vllm = {**lab_cluster_vllm(i, pair), "model": {"name": "tiny-llama", "path": str(model)}}
            vllm["cluster"] = {**vllm["cluster"], "name": f"pair{i // 2}"}
        else:
            vllm = {"accelerator": "cuda", "model": {"name": "tiny-llama", "host_path": HOST_PATH},
                    "flags": {"max_model_len": 512, "host": "0.0.0.0"}}
        if kind != "node":
            standalone.append(name)
        data["vllm"] = vllm
        hosts.append((name, data))
        kinds[name] = kind
    balancer = ("lb01", {**login, "ssh_hostname": "10.19.0.1",
                         "vllm_lb": {"port": 8080, "hosts": standalone}})
    return hosts, [balancer], kinds


class GivenFacts:
    """The stubbed fact layer: each host's answers, given (read by `Host.get_fact` during a run)."""

    def __init__(self, hosts: list[tuple[str, dict[str, Any]]], others: list[tuple[str, dict[str, Any]]],
                 kinds: dict[str, str], model: Path):
        import json

        from tests.unit.test_deploy_decisions import FRESH, ROOT_LOGIN
        from vllm_fleet.core.modelinfo import weight_bytes_from_dir
        from vllm_fleet.roles.facts import VllmHost
        from vllm_fleet.roles.nvidia_facts import NvidiaGpus

        nvidia = {kind: NvidiaGpus().process(framed_nvidia(c)) for kind, c in GPU_CAPTURES.items()}
        self.host_model = {"config": json.loads((model / "config.json").read_text()),
                           "weight_bytes": weight_bytes_from_dir(model)}
        self.answers: dict[str, dict[str, Any]] = {name: {"LoginAccess": ROOT_LOGIN} for name, _ in others}
        for name, data in hosts:
            vh = VllmHost().process(FRESH.replace("10.77.1.2", data["ssh_hostname"]).splitlines())
            self.answers[name] = {"VllmHost": vh, "NvidiaGpus": nvidia.get(kinds[name]),
                                  "LoginAccess": ROOT_LOGIN}

    def get(self, host_name: str, fact: str, kwargs: dict[str, Any]) -> Any:
        if fact == "HostModel":
            return self.host_model
        if fact == "Manifest":  # a never-deployed host: none of the files the deploy compares is there
            return dict.fromkeys(kwargs["paths"])
        found = self.answers[host_name].get(fact)
        if found is None:
            raise AssertionError(f"{host_name}: the bench gives no {fact} fact ({kwargs})")
        return found


def inventory_of(hosts: list[tuple[str, dict[str, Any]]], others: list[tuple[str, dict[str, Any]]]):
    """A pyinfra Inventory as an inventory file gives it: groups of hosts, fleet-wide group data."""
    from pyinfra.api import Inventory

    defaults = {"vllm_defaults": {"version": "0.32.0", "keep_releases": 3, "flags": {"max_num_seqs": 8}}}
    return Inventory((hosts + others, defaults), vllm_hosts=([n for n, _ in hosts], {}),
                     balancers=([n for n, _ in others], {}))


@contextmanager
def run_context(inventory, given: GivenFacts) -> Iterator[Any]:
    """One pyinfra State (so one FleetRun) in context; `Host.get_fact` answers from `given`, and
    `Host.connect` refuses: nothing here may reach a host."""
    from pyinfra.api import Config, State
    from pyinfra.api.host import Host
    from pyinfra.context import ctx_config, ctx_inventory, ctx_state

    def connect(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{self.name}: the bench connects to no host")

    state = State(inventory, Config())
    for h in inventory:
        state.activate_host(h)
    real = Host.get_fact, Host.connect
    Host.get_fact = lambda self, cls, *a, **kw: given.get(self.name, cls.__name__, kw)  # type: ignore[method-assign]
    Host.connect = connect  # type: ignore[method-assign]
    try:
        with ctx_state.use(state), ctx_inventory.use(inventory), ctx_config.use(state.config):
            yield state
    finally:
        Host.get_fact, Host.connect = real  # type: ignore[method-assign]


Run = tuple[float, list[tuple[float, ...]]]  # (once-per-run seconds, each host's seconds per step)


def decide(inventory, given: GivenFacts, vllm_names: list[str]) -> Run:
    """One run: every vLLM host decided in the deploy's order."""
    from pyinfra.context import ctx_host

    from vllm_fleet.core import render
    from vllm_fleet.roles import hostplan, lb

    clock = time.perf_counter
    per_host = []
    with run_context(inventory, given):
        with ctx_host.use(inventory.get_host(vllm_names[0])):
            t0 = clock()
            hostplan.inventory_specs(check_secrets=False)  # the first host's call: the whole inventory
            once = clock() - t0
        for name in vllm_names:
            with ctx_host.use(inventory.get_host(name)):
                t0 = clock()
                spec = hostplan.inventory_specs().get(name)  # as this_host() asks (its login check aside)
                t1 = clock()
                facts, _ = hostplan.host_facts(spec)
                t2 = clock()
                plan = hostplan.plan_for(spec, facts, os.environ)
                t3 = clock()
                lb.fronting(name)
                t4 = clock()
                for inst in plan.instances:
                    render.unit(plan, inst)
                    render.env_file(inst, os.environ)
                    render.environment_file(inst)
                    render.serve_config(plan, inst)
                    if inst.watchdog is not None:
                        render.watchdog_units(inst)
                t5 = clock()
            per_host.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))
    return once, per_host


def collect(inventory, given: GivenFacts, vllm_names: list[str]) -> Run:
    """One run of the whole deploy's collection through pyinfra's API, operations included: each host
    in turn, as pyinfra's add_deploy does it (the balancer is collected too, and skipped by the deploy)."""
    from pyinfra.context import ctx_host

    from tests.unit.test_deploy_decisions import LOCK
    from vllm_fleet.roles import install
    from vllm_fleet.roles.vllm import deploy_vllm

    wanted = set(vllm_names)
    per_host = []
    real_lock = install.lock_of
    install.lock_of = lambda plan, vh: LOCK  # type: ignore[assignment]
    try:
        with run_context(inventory, given) as state:
            for h in inventory:
                if h.name not in wanted:  # the balancer: the drain's login check reads its facts only
                    h.connected = True
            for h in state.inventory.get_active_hosts():
                with ctx_host.use(h):
                    t0 = time.perf_counter()
                    deploy_vllm()
                    took = time.perf_counter() - t0
                if h.name in wanted:
                    per_host.append((took,))
    finally:
        install.lock_of = real_lock  # type: ignore[assignment]
    return 0.0, per_host


def measure(sizes: list[int], rounds: int, once: Callable[[int], Run],
            steps: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """Each size's seconds per step, like for like across sizes on a machine that is busy with other
    work: the sizes take turns in every round, each size runs `rounds` times, and its hosts are
    counted in blocks of ten (one block of the mix); each block's step takes its fastest time over the
    rounds, and a size's step is the sum over its blocks. So each figure at every size is a minimum
    over the same number of equally short samples. The once-per-run step takes its fastest run."""
    runs: dict[int, list[Run]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            runs[n].append(once(n))
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        spent = dict.fromkeys(steps, 0.0)
        if steps[0] == "validate":
            spent["validate"] = min(r[0] for r in runs[n])
        per_host_steps = [s for s in steps if s != "validate"]
        for start in range(0, n, len(BLOCK)):
            for i, step in enumerate(per_host_steps):
                spent[step] += min(sum(t[i] for t in r[1][start:start + len(BLOCK)]) for r in runs[n])
        out[n] = spent
    return out


def report(title: str, sizes: list[int], best: dict[int, dict[str, float]], steps: tuple[str, ...]) -> None:
    print(title)
    print(f"  {'hosts':>6} {'total s':>9} {'s/host':>9}   " + " ".join(f"{s + ' ms':>11}" for s in steps))
    for n in sizes:
        total = sum(best[n].values())
        print(f"  {n:>6} {total:>9.3f} {total / n:>9.5f}   "
              + " ".join(f"{best[n][s] / n * 1000:>11.3f}" for s in steps))
    small, large = sizes[0], sizes[-1]
    ratio = sum(best[large].values()) / large / (sum(best[small].values()) / small)
    print(f"  per-host time at {large} / at {small}: {ratio:.2f} x   (goal <= {GOAL})")
    if len(steps) > 1:
        grew = [(s, best[large][s] / large / (best[small][s] / small)) for s in steps if best[small][s] > 0]
        grew = [(s, r) for s, r in grew if r > GOAL]
        print("  steps whose per-host cost grows with the fleet: "
              + (", ".join(f"{s} ({r:.1f} x per host)" for s, r in grew) if grew else "none"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000", help="fleet sizes, comma-separated, smallest first")
    ap.add_argument("--runs", type=int, default=5,
                    help="runs of each size; each block of ten hosts keeps its fastest")
    ap.add_argument("--collect", action="store_true",
                    help="also collect the whole deploy through pyinfra's API (stubbed facts)")
    ap.add_argument("--collect-runs", type=int, default=3,
                    help="runs of each size for --collect (about 12 ms per host each)")
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    sys.path.insert(0, str(ROOT))
    scratch = Path(tempfile.mkdtemp(prefix="controller-scale-"))
    # the controller's cache (its record of the model files' hashes) in the scratch dir, not the user's
    os.environ["VLLM_FLEET_CACHE"] = str(scratch / "cache")
    os.environ.setdefault(KEY_VAR, "controller-scale-bench-key")  # rendered into env files, never sent
    from fleetlab.tinymodel import make_tiny_model

    model = make_tiny_model(scratch / "tiny-llama")
    logging.getLogger("pyinfra").setLevel(logging.ERROR)  # each plan's warnings (GPU persistence mode, ...)
    setups = {}
    for n in sizes:
        hosts, others, kinds = fleet(n, model)
        setups[n] = (hosts, others, GivenFacts(hosts, others, kinds, model))

    def decided(n: int) -> Run:
        hosts, others, given = setups[n]
        return decide(inventory_of(hosts, others), given, [name for name, _ in hosts])

    decided(sizes[0])  # warm: imports, templates compiled, the model files' hashes recorded
    cores = f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"
    report(f"\ncontroller decision work per host, facts given, no SSH; {args.runs} runs "
           f"({cores}):", sizes, measure(sizes, args.runs, decided, STEPS), STEPS)
    print("  (validate: once per run, the first host's call; shown per host of the fleet)")

    if args.collect:
        def collected(n: int) -> Run:
            hosts, others, given = setups[n]
            return collect(inventory_of(hosts, others), given, [name for name, _ in hosts])

        collected(sizes[0])
        report(f"\nthe whole deploy collected through pyinfra's API, operations included, stubbed facts; "
               f"{args.collect_runs} runs:", sizes,
               measure(sizes, args.collect_runs, collected, ("collect",)), ("collect",))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
