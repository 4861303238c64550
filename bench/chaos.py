"""Rounds of random faults on lab hosts, then the invariants a fleet's operators count on.

  python bench/chaos.py [--rounds 20] [--seed 1] [--hosts lab1,lab2] [--faults two-deploys:3,sigkill]

Needs a deployed lab (`make demo`). The rounds are dealt to the hosts in turn (lab1 logs in through
sudo, lab2 as root), and the hosts' rounds run at once, as operators working on different hosts do;
each host draws its faults from its own generator, so a seed gives the same rounds whatever the
timing. A round runs real deploys and rollbacks against its host (`pyinfra` processes, as operators
would), waits until every run has ended and no lease is live, then checks:

- the host serves exactly one config, and it is one that a run of this round committed or the one from
  before the round (never a third state): the live config's max-num-seqs is among those values, the
  host's recorded state holds that same config and unit, and `vllm-fleet status` passes its smoke test;
- nothing partial is left: no build directory, no staged upload, no lease file;
- every exit code matches its outcome: a deploy that exited 0 is the one serving, unless a run after it
  changed the host (it then committed too, or was killed after its commit);
- two deploys that met: one waited for the other's lease and then applied its own config (the host
  serves it), or was refused naming the holder.

Faults: a controller SIGKILLed at a random moment, then the next operator's deploy; two deploys with
different configs 0 to 5 s apart; a deploy and a rollback at once; vLLM killed during the smoke test;
the host's link cut for 3 s mid-run; the host's power cut mid-deploy (every process of it killed at
once, fleetlab.power_cut), booted again, then the next operator's deploy. Not here: the state file
system filled (the lab hosts' disks are this machine's own disk; tests/unit/test_hoststate.py fails a
commit with ENOSPC instead). Prints each round, then faults by kind, concurrent pairs and violations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fleetlab as lab  # noqa: E402

INVENTORY = str(ROOT / "tests/hosts/inventory.py")
BIN = Path(sys.executable).parent
FAULTS = ("sigkill", "two-deploys", "deploy-and-rollback", "kill-vllm-in-smoke", "link-cut", "power-cut")
SEQS = (4, 5, 6, 7, 8)  # the lab's own is 8
POWER = threading.Lock()
RUNNING: dict[str, list[subprocess.Popen]] = {}  # host -> this round's runs, for cleanup
WAITED = "the host lease is held by deploy: "  # the line of a run that waits (roles/lease.py)
REFUSED = re.compile(r"the host lease is held by .*; waited [\d.]+ s, nothing was changed")
TTL = "8"  # a killed controller's lease expires quickly here; the default is 60 s


def on(host: str, cmd: str, timeout: int = 120) -> str:
    return lab.ssh(lab.LabHost(int(host.removeprefix("lab"))), cmd, timeout=timeout).stdout


def start(host: str, what: str, seqs: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "VLLM_FLEET_LEASE_TTL_S": TTL,
           "VLLM_FLEET_TEST_OVERRIDES": json.dumps({host: {"flags": {"max_num_seqs": seqs}}} if seqs else {})}
    deploy = "deploys/vllm.py" if what == "deploy" else "deploys/rollback.py"
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115  (read when the round ends; a pipe would fill up)
    proc = subprocess.Popen([str(BIN / "pyinfra"), "-y", "--limit", host, INVENTORY, deploy], cwd=ROOT,
                            env=env, text=True, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log  # type: ignore[attr-defined]
    RUNNING.setdefault(host, []).append(proc)
    return proc


def live_seqs(host: str) -> str:
    return on(host, "grep -h '^max-num-seqs:' /etc/vllm/default.yaml").split(":")[-1].strip()


def recorded_matches_live(host: str) -> str | None:
    out = on(host, "d=$(readlink -f /var/lib/vllm-fleet/active)/current; "
                   "cmp -s $d/default.yaml /etc/vllm/default.yaml || echo config; "
                   "cmp -s $d/vllm-default.service /etc/systemd/system/vllm-default.service || echo unit")
    return out.strip() or None


def leftovers(host: str) -> str:
    return on(host, "ls -d /opt/vllm/releases/.tmp-* /var/lib/vllm-fleet/lease "
                    "/opt/vllm/models/.staging/* 2>/dev/null; true").strip()


def settle_runs(procs: list[subprocess.Popen], limit: float = 900) -> dict[int, float]:
    """Every run ended (a killed one is reaped): pid -> when it ended."""
    deadline = time.monotonic() + limit
    ended: dict[int, float] = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for p in procs:
            if p.pid not in ended and p.poll() is not None:
                ended[p.pid] = time.monotonic()
        time.sleep(0.2)
    return ended


def settle(host: str, procs: list[subprocess.Popen], limit: float = 900) -> dict[int, float]:
    """Every run ended and no live lease on the host."""
    deadline = time.monotonic() + limit
    ended = settle_runs(procs, limit)
    while time.monotonic() < deadline:
        show = json.loads(on(host, "python3 /usr/local/lib/vllm-fleet/lease.py show") or "{}")
        if not show.get("live"):
            break
        time.sleep(1)
    return ended


def status_ok(host: str) -> bool:
    proc = subprocess.run([str(BIN / "vllm-fleet"), "status", INVENTORY, "--limit", host], cwd=ROOT,
                          env=os.environ, capture_output=True, text=True, timeout=600)
    return proc.returncode == 0


def wait_for(pattern: str, host: str, since: float, limit: float = 300) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        log = on(host, f"journalctl -u vllm-default --no-pager -o cat --since @{int(since)}")
        if re.search(pattern, log):
            return True
        time.sleep(0.5)
    return False


def veth(host: str) -> str:
    """The controller's end of the host's link (fleetlab names it ve-<host>)."""
    name = f"ve-{host}"
    if subprocess.run(["ip", "link", "show", name], capture_output=True).returncode != 0:
        raise RuntimeError(f"no link {name} on the controller")
    return name


def pair_violations(outcomes: list[dict], live: str) -> list[str]:
    """Two deploys that met: one held the lease, the other waited for it and then applied its own
    config (so the host serves the waiter's), or was refused naming the holder and changed nothing."""
    ok = [o for o in outcomes if o["rc"] == 0]
    failed = [o for o in outcomes if o["rc"] != 0]
    unnamed = [o for o in failed if not o["refused"]]
    if unnamed:
        return [f"a deploy of the pair failed without naming the lease's holder: {unnamed[0]['tail'][-300:]}"]
    if not ok:
        return ["both deploys of the pair were refused: neither held the lease"]
    waited = [o for o in ok if o["waited"]]
    if len(ok) == 2 and len(waited) != 1:
        return [f"both deploys exited 0 but {len(waited)} of them waited for the other's lease"]
    if len(ok) == 2 and live != waited[0]["seqs"]:
        return [f"the deploy that waited applied max-num-seqs {waited[0]['seqs']}, the host serves {live}"]
    return []


def run_round(rng: random.Random, host: str, fault: str) -> dict:
    RUNNING[host] = []
    before = live_seqs(host)
    choices = [str(s) for s in SEQS if str(s) != before]
    a, b = rng.sample(choices, 2)
    runs: list[tuple[str, str | None, subprocess.Popen, float]] = []  # (what, seqs, process, started)
    landed = True
    if fault == "sigkill":
        p = start(host, "deploy", int(a))
        runs.append(("deploy", a, p, time.monotonic()))
        time.sleep(rng.uniform(1, 45))
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        else:
            landed = False  # the run had finished: this round is two deploys one after the other
        settle(host, [p])
        follow = start(host, "deploy", int(b))  # the next operator's run takes the lease over
        runs.append(("deploy", b, follow, time.monotonic()))
    elif fault in ("two-deploys", "deploy-and-rollback"):
        p = start(host, "deploy", int(a))
        runs.append(("deploy", a, p, time.monotonic()))
        time.sleep(rng.uniform(0, 5))
        q = start(host, "deploy", int(b)) if fault == "two-deploys" else start(host, "rollback")
        second = ("deploy", b) if fault == "two-deploys" else ("rollback", None)
        runs.append((*second, q, time.monotonic()))
    elif fault == "kill-vllm-in-smoke":
        since = time.time()
        p = start(host, "deploy", int(a))
        runs.append(("deploy", a, p, time.monotonic()))
        landed = wait_for(r"Application startup complete|Uvicorn running", host, since)
        if landed:
            on(host, "systemctl kill --signal=SIGKILL vllm-default.service")
    elif fault == "power-cut":
        p = start(host, "deploy", int(a))
        runs.append(("deploy", a, p, time.monotonic()))
        time.sleep(rng.uniform(1, 40))
        landed = p.poll() is None
        box = lab.LabHost(int(host.removeprefix("lab")))
        # one host off at a time: fleetlab's boot rewrites the lab's host list from the hosts alive then,
        # so a host booting while another is off would drop that one from the lab
        with POWER:
            lab.power_cut(box)
            settle_runs([p])
            lab.power_on(box, log=lambda *_: None)
        # the host boots on what its disk holds; the next run takes the dead run's lease over and converges
        follow = start(host, "deploy", int(b))
        runs.append(("deploy", b, follow, time.monotonic()))
    elif fault == "link-cut":
        p = start(host, "deploy", int(a))
        runs.append(("deploy", a, p, time.monotonic()))
        time.sleep(rng.uniform(2, 20))
        link = veth(host)
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        time.sleep(3)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
    ended = settle(host, [r[2] for r in runs])
    outcomes = []
    for what, seqs, proc, _ in runs:
        proc.log.seek(0)  # type: ignore[attr-defined]
        out = proc.log.read()  # type: ignore[attr-defined]
        outcomes.append({"what": what, "seqs": seqs, "rc": proc.returncode, "ended": ended.get(proc.pid, 0),
                         "traceback": "Traceback" in out, "waited": WAITED in out,
                         "refused": REFUSED.search(out) is not None, "tail": out[-600:]})
    violations = []
    live = live_seqs(host)
    allowed = {before} | {o["seqs"] for o in outcomes if o["seqs"]}
    if any(o["what"] == "rollback" for o in outcomes):
        allowed |= {str(s) for s in SEQS}  # a rollback restores whatever the host had before
    if live not in allowed:
        violations.append(f"third state: serving max-num-seqs {live}, runs wanted {sorted(allowed)}")
    mismatch = recorded_matches_live(host)
    if mismatch:
        violations.append(f"recorded state differs from the live {mismatch}")
    left = leftovers(host)
    if left:
        violations.append(f"left behind: {left.split()}")
    if not status_ok(host):
        violations.append("vllm-fleet status fails: the host does not serve what it records")
    # runs hold the lease one after the other, so the last to end is the last that could commit
    last = max(outcomes, key=lambda o: o["ended"])
    if last["rc"] == 0 and last["what"] == "deploy" and live != last["seqs"]:
        violations.append(f"the last deploy exited 0 for max-num-seqs {last['seqs']}, the host serves {live}")
    violations += [f"a {o['what']} printed a traceback: {o['tail'][-300:]}"
                   for o in outcomes if o["traceback"]]
    if fault == "two-deploys":
        violations += pair_violations(outcomes, live)
    return {"host": host, "fault": fault, "landed": landed, "before": before, "live": live,
            "rcs": [o["rc"] for o in outcomes], "violations": violations}


def cleanup(host: str) -> None:
    """After a round the harness could not finish: the host's runs stopped, its link up, it powered on."""
    for proc in RUNNING.pop(host, []):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    subprocess.run(["ip", "link", "set", f"ve-{host}", "up"], capture_output=True)
    with POWER:
        lab.power_on(lab.LabHost(int(host.removeprefix("lab"))), log=lambda *_: None)
    settle(host, [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hosts", default="lab1,lab2")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="comma-separated; FAULT:N weighs one N times (two-deploys:3)")
    args = ap.parse_args(argv)
    hosts = args.hosts.split(",")
    if len(set(hosts)) != len(hosts):
        ap.error("--hosts: each host once (its rounds run one after the other)")
    faults = [name for spec in args.faults.split(",")
              for name, _, n in [spec.partition(":")] for _ in range(int(n or 1))]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        ap.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    kinds: Counter[str] = Counter()
    landed: Counter[str] = Counter()
    bad: list[str] = []
    printing = threading.Lock()
    t0 = time.monotonic()

    def worker(host: str) -> None:
        """A host's rounds, one after the other; hosts run at once, as operators on different hosts do.
        Each host draws from its own generator, so a seed gives the same rounds whatever the timing."""
        rng = random.Random(f"{args.seed}:{host}")
        for i in range(1 + hosts.index(host), args.rounds + 1, len(hosts)):
            fault = rng.choice(faults)
            try:
                r = run_round(rng, host, fault)
            except Exception as e:  # noqa: BLE001  (a round the harness could not check is a violation)
                r = {"landed": False, "before": "?", "live": "?", "rcs": [],
                     "violations": [f"harness: {e!r}"]}
                cleanup(host)
            with printing:
                kinds[fault] += 1
                landed[fault] += r["landed"]
                bad.extend(f"round {i} ({host}, {fault}): {v}" for v in r["violations"])
                label = fault + ("" if r["landed"] else " (missed)")
                verdict = "OK" if not r["violations"] else "VIOLATED: " + "; ".join(r["violations"])
                print(f"round {i:3d}  {host}  {label:29s} before {r['before']} -> {r['live']}  "
                      f"exit {r['rcs']}  {verdict}", flush=True)

    threads = [threading.Thread(target=worker, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each host back on the inventory's own config
    for h in hosts:
        subprocess.run([str(BIN / "pyinfra"), "-y", "--limit", h, INVENTORY, "deploys/vllm.py"], cwd=ROOT,
                       env={**os.environ, "VLLM_FLEET_TEST_OVERRIDES": "{}"}, capture_output=True)
    pairs = landed["two-deploys"] + landed["deploy-and-rollback"]
    print(f"\nchaos: {args.rounds} rounds on {len(hosts)} hosts in {time.monotonic() - t0:.0f} s; "
          "faults (landed of drawn): "
          + ", ".join(f"{k} {landed[k]}/{n}" for k, n in sorted(kinds.items())))
    print(f"concurrent pairs: {pairs} ({landed['two-deploys']} deploy+deploy, "
          f"{landed['deploy-and-rollback']} deploy+rollback)")
    print(f"violations: {len(bad)}")
    for line in bad:
        print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
