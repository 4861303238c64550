"""One change per host at a time, on real lab hosts over real SSH (lab1 through sudo, lab2 as root).

Two operators' deploys meet on one host: the second waits for the first's host lease and then applies
its own config, or is refused naming the holder; never a third state. A controller SIGKILLed while it
holds the lease leaves it to expire, and the next deploy takes it over and says whose it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

from tests.hosts.conftest import INVENTORY, PYINFRA, ROOT, deploy, on

PAIRS = int(os.environ.get("VLLM_FLEET_TEST_PAIRS", "2"))  # VLLM_FLEET_TEST_PAIRS=10: 10 pairs
SEQS = ("max_num_seqs", "max-num-seqs")
WAITING = "the host lease is held by "  # the line of a run that waits (roles/lease.py)
WAITED = WAITING + "deploy: "


def start(host: str, seqs: int | None, env: dict | None = None,
          deploy_file: str = "deploys/vllm.py") -> subprocess.Popen:
    over = {host: {"flags": {SEQS[0]: seqs}}} if seqs else {}
    e = {**os.environ, **(env or {}), "VLLM_FLEET_TEST_OVERRIDES": json.dumps(over)}
    return subprocess.Popen([PYINFRA, "-y", "--limit", host, INVENTORY, deploy_file], cwd=ROOT, env=e,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def host_truth(host: str) -> dict:
    """What the host serves and records: the live config's value, the recorded config's, the running
    process's own command line config (the unit reads /etc/vllm), and the lease file."""
    live = on(host, f"grep -h '^{SEQS[1]}:' /etc/vllm/default.yaml").split(":")[-1].strip()
    state = json.loads(on(host, "cat /var/lib/vllm-fleet/state.json"))
    recorded_dir = on(host, "readlink -f /var/lib/vllm-fleet/active").strip()
    recorded = on(host, f"grep -h '^{SEQS[1]}:' {recorded_dir}/current/default.yaml").split(":")[-1].strip()
    lease = on(host, "test -e /var/lib/vllm-fleet/lease && echo held || echo free").strip()
    return {"live": live, "recorded": recorded, "release": state["current"]["release"], "lease": lease}


def test_two_deploys_at_once_end_on_one_of_their_configs_never_a_third(deployed):
    """Offsets 0 to 5 s between the two deploys; each pair alternates the configs, so the host always
    has something to change. Every deploy that exits 0 applied its config; the host ends on the config
    of the one that committed last, recorded as it is live; the lease is given back. On lab1, the sudo
    login (the root login holds and takes over leases in the killed-controller test, on lab2). The host
    is left on the last pair's config: the next test changes it again."""
    host = "lab1"
    results = []
    for i in range(PAIRS):
        a, b = 5 + (i % 2), 7 - (i % 2)  # 5/6 then 6/5: never the lab's 8, never equal
        offset = (5.0 * i / max(1, PAIRS - 1)) if PAIRS > 1 else 0.0
        first = start(host, a)
        time.sleep(offset)
        second = start(host, b)
        out_a, out_b = first.communicate(timeout=900)[0], second.communicate(timeout=900)[0]
        truth = host_truth(host)
        results.append((offset, first.returncode, second.returncode, truth))
        for rc, out in ((first.returncode, out_a), (second.returncode, out_b)):
            assert "Traceback" not in out, out[-3000:]
            assert rc == 0, out[-4000:]  # the second waits (bound 120 s) and then applies its own
        waited = [name for name, out in (("a", out_a), ("b", out_b)) if WAITED in out]
        assert len(waited) == 1, (out_a[-2000:], out_b[-2000:])  # they met: exactly one waited
        # both committed, one after the other: the host serves the one that waited, recorded as live
        later = a if waited == ["a"] else b
        assert truth["live"] == truth["recorded"] == str(later), (truth, out_a[-1500:], out_b[-1500:])
        assert truth["lease"] == "free"
    print("\n".join(f"offset {o:.1f} s: rc {ra}/{rb}, host ends on {t['live']}" for o, ra, rb, t in results))


def test_a_second_deploy_that_waits_too_long_is_refused_naming_the_holder_and_changes_nothing(deployed):
    """7 is a change whatever the host serves (the lab's 8, or 5 or 6 from the test before); the host is
    left on it for the leftovers test after this one, whose deploy converges lab1 again."""
    host = "lab1"
    first = start(host, 7)
    time.sleep(1.5)
    second = start(host, 6, env={"VLLM_FLEET_LEASE_WAIT_S": "3"})
    out_b = second.communicate(timeout=300)[0]
    out_a = first.communicate(timeout=900)[0]
    assert first.returncode == 0, out_a[-3000:]
    assert second.returncode != 0 and "Traceback" not in out_b
    text = re.sub(r"\x1b\[[0-9;]*m", "", out_b)
    assert re.search(r"lab1: the host lease is held by deploy: pyinfra .*vllm\.py by deploy@\S+ \(pid \d+\), "
                     r"since \S+; waited 3 s, nothing was changed", text), text[-3000:]
    assert host_truth(host)["live"] == "7"


def test_a_killed_controllers_lease_expires_and_the_next_deploy_takes_it_over(deployed):
    """SIGKILL while the deploy holds the lease (collection is done, the config is being validated):
    the host's holder stops with its channel, and the next deploy takes the lease over after its ttl."""
    host = "lab2"
    ttl = {"VLLM_FLEET_LEASE_TTL_S": "6"}
    victim = start(host, 5, env=ttl)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and on(host, "test -e /var/lib/vllm-fleet/lease || echo free"):
        time.sleep(0.3)
    time.sleep(2)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert json.loads(on(host, "python3 /usr/local/lib/vllm-fleet/lease.py show"))["lease"] is not None
    run = deploy(limit=host, env=ttl)
    assert run.rc == 0, run.output[-4000:]
    took = (r"took over the expired lease of deploy: pyinfra .* \(pid \d+\), since \S+: not renewed "
            r"for \d+ s \(its controller died or lost its connection\)")
    assert re.search(took, run.output), run.output[-3000:]
    truth = host_truth(host)
    assert truth["live"] == truth["recorded"] == "8" and truth["lease"] == "free"


def test_what_a_killed_run_left_is_removed_by_the_next_run(deployed):
    """The files a controller killed mid-upload leaves (planted here as that run would leave them: a
    partial upload in the sudo login's directory, a staged model file, an incoming wheel tar): the next
    deploy's first operation removes them, and a converged host then runs no such operation."""
    host = "lab1"
    planted = ["/opt/vllm/.upload/deploy/0.model.safetensors", "/opt/vllm/models/.staging/1.config.json",
               "/var/cache/vllm-fleet/wheels/.incoming-0.32.0-cpu.tar"]
    on(host, "install -d -m 0700 -o deploy -g deploy /opt/vllm/.upload/deploy; "
             "install -d -m 0700 /opt/vllm/models/.staging; "
             + "; ".join(f"head -c 1M /dev/zero > {p}" for p in planted))
    run = deploy(limit=host)
    assert run.rc == 0, run.output[-3000:]
    assert "remove what a killed run left (3 paths)" in run.output, run.output[-3000:]
    assert on(host, "ls -d " + " ".join(planted) + " 2>/dev/null; true").split() == []
    again = deploy(limit=host)
    assert again.rc == 0 and "killed run left" not in again.output


def test_a_deploy_meets_a_rollback_and_a_stage_meets_a_deploy(deployed):
    """deploy + rollback at once: both finish, one after the other, and the host serves what the later
    one left (the deploy's config, or what the rollback restored), recorded as live. stage + deploy at
    once: the stage never changes what is live, so the host serves the deploy's config either way."""
    host = "lab2"
    state = json.loads(on(host, "cat /var/lib/vllm-fleet/state.json"))
    before = host_truth(host)["live"]
    assert state.get("previous"), state
    dep = start(host, 5)
    time.sleep(1.0)
    rb = start(host, None, deploy_file="deploys/rollback.py")
    out_d, out_r = dep.communicate(timeout=900)[0], rb.communicate(timeout=900)[0]
    assert dep.returncode == 0 and rb.returncode == 0, (out_d[-3000:], out_r[-3000:])
    truth = host_truth(host)
    # rollback second: back to what the deploy replaced; rollback first: the deploy's 5 on top
    assert (WAITING in out_r) != (WAITING in out_d), (out_d[-2000:], out_r[-2000:])  # exactly one waited
    expected = before if WAITING in out_r else "5"
    assert truth["live"] == truth["recorded"] == expected, (truth, out_r[-2000:])
    assert truth["lease"] == "free"

    stage = start(host, 7, deploy_file="deploys/stage.py")
    time.sleep(0.5)
    dep = start(host, 6)
    out_s, out_d = stage.communicate(timeout=900)[0], dep.communicate(timeout=900)[0]
    assert stage.returncode == 0 and dep.returncode == 0, (out_s[-3000:], out_d[-3000:])
    assert (WAITING in out_s) != (WAITING in out_d), (out_s[-2000:], out_d[-2000:])
    truth = host_truth(host)
    assert truth["live"] == truth["recorded"] == "6" and truth["lease"] == "free", truth
    restore = deploy(limit=host)
    assert restore.rc == 0, restore.output[-3000:]
