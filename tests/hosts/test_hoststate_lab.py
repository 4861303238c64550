"""Items 6 and 9 on a real host: hoststate killed at random points and run twice at once never leaves
state and snapshot files disagreeing nor a rollback that fails; a vllm unit someone else put there
survives a deploy."""

from __future__ import annotations

import json

from tests.hosts.conftest import deploy, on, unit_props

HOST = "lab2"
H = "python3 /usr/local/lib/vllm-fleet/hoststate.py"

# a comment appended to the live config each round: every commit is a real change (a new generation),
# and nothing restarts until the restore
FUZZ = f"""
set -u
cp /etc/vllm/default.yaml /tmp/default.yaml.fuzz
echo "# hoststate fuzz 0" >> /etc/vllm/default.yaml
t0=$(date +%s%N); {H} commit {{release}} >/dev/null; t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 * 3 / 2 + 1 ))  # kills land anywhere from start-up to past the end
killed=0; done=0
for i in $(seq 1 {{rounds}}); do
  {{{{ cat /tmp/default.yaml.fuzz; echo "# hoststate fuzz $i"; }}}} > /etc/vllm/default.yaml
  {H} commit {{release}} >/dev/null 2>&1 &
  pid=$!
  d=$((RANDOM % ms))
  sleep "$((d / 1000)).$(printf %03d $((d % 1000)))"
  kill -9 $pid 2>/dev/null
  wait $pid; rc=$?
  [ $rc -eq 137 ] && killed=$((killed + 1))
  [ $rc -eq 0 ] && done=$((done + 1))
done 2>/dev/null
echo "killed=$killed done=$done"
"""

# the state in force against its generation's files, as the unit test checks it
CONSISTENT = r"""
import hashlib, json, os
top = "/var/lib/vllm-fleet"
gen = os.path.join(top, os.readlink(top + "/active"))
state = json.load(open(gen + "/state.json"))
assert json.load(open(top + "/state.json")) == state
for which in ("current", "previous"):
    d = os.path.join(gen, which)
    files = {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest() for n in os.listdir(d)}
    assert files == (state[which]["files"] if which in state else {}), which
assert not os.path.exists(top + "/snapshots")
print(json.dumps({"gen": gen, "release": state["current"]["release"]}))
"""


def consistent(host: str) -> dict:
    return json.loads(on(host, "python3 -", stdin=CONSISTENT).strip().splitlines()[-1])


def test_hoststate_killed_at_random_points_then_restore_works(deployed):
    release = on(HOST, "readlink /opt/vllm/current").strip().rsplit("/", 1)[-1]
    try:
        out = on(HOST, "bash -s", stdin=FUZZ.format(rounds=80, release=release))
        counts = dict(kv.split("=") for kv in out.split()[-2:])
        assert int(counts["killed"]) >= 10 and int(counts["done"]) >= 10, out
        found = consistent(HOST)
        assert found["release"] == release
        on(HOST, "echo 'bad: change' >> /etc/vllm/default.yaml")
        restored = json.loads(on(HOST, f"{H} restore current; echo rc=$?").strip().splitlines()[-2])
        assert restored["release"] == release
        assert on(HOST, f"cmp /etc/vllm/default.yaml {found['gen']}/current/default.yaml && echo same"
                  ).strip() == "same"
        assert on(HOST, "ls -A /var/lib/vllm-fleet/gen | grep -c '^[.]'").strip() == "0"  # nothing left
    finally:
        on(HOST, "cp /tmp/default.yaml.fuzz /etc/vllm/default.yaml 2>/dev/null; rm -f /tmp/default.yaml.fuzz")
        # the restore restarted the instance: let it finish starting, since a vLLM stopped while it
        # starts waits out the unit's TimeoutStopSec= before systemd kills it
        on(HOST, "for i in $(seq 1 120); do curl -sf -o /dev/null http://127.0.0.1:8000/health && break; "
                 "sleep 0.5; done")
        run = deploy(limit=HOST)  # back to the inventory's config, committed again
    assert run.rc == 0, run.output[-4000:]
    assert unit_props(HOST)["ActiveState"] == "active"


def test_two_commits_at_once_serialize_and_a_held_lock_is_refused_by_name(deployed):
    release = on(HOST, "readlink /opt/vllm/current").strip().rsplit("/", 1)[-1]
    try:
        out = on(HOST, f"""set -u; cp /etc/vllm/default.yaml /tmp/default.yaml.fuzz; bad=0
            for i in $(seq 1 40); do
              {{ cat /tmp/default.yaml.fuzz; echo "# concurrent $i"; }} > /etc/vllm/default.yaml
              {H} commit {release} >/dev/null 2>&1 & a=$!
              {H} commit {release} >/dev/null 2>&1 & b=$!
              wait $a || bad=$((bad + 1)); wait $b || bad=$((bad + 1))
            done; echo "bad=$bad" """)
        assert out.strip().endswith("bad=0"), out
        assert consistent(HOST)["release"] == release
        refused = on(HOST, "flock /var/lib/vllm-fleet/lock sleep 5 & sleep 0.5; "
                           f"VLLM_FLEET_LOCK_WAIT_S=1 {H} commit {release} 2>&1; echo rc=$?; wait")
        assert "another vllm-fleet command holds /var/lib/vllm-fleet/lock" in refused
        assert "rc=1" in refused
    finally:
        on(HOST, "cp /tmp/default.yaml.fuzz /etc/vllm/default.yaml 2>/dev/null; rm -f /tmp/default.yaml.fuzz")
        run = deploy(limit=HOST)
    assert run.rc == 0, run.output[-4000:]


ROUTER_UNIT = "[Unit]\nDescription=someone else's router\n[Service]\nExecStart=/bin/sleep infinity\n"


def test_a_vllm_unit_the_toolkit_did_not_create_survives_a_deploy(deployed):
    on(HOST, "cat > /etc/systemd/system/vllm-router.service && echo 'routes: []' > /etc/vllm/router.yaml "
             "&& systemctl daemon-reload", stdin=ROUTER_UNIT)
    try:
        run = deploy(limit=HOST)
        assert run.rc == 0, run.output[-4000:]
        assert "removing vllm-router.service" not in run.output
        assert on(HOST, "cat /etc/systemd/system/vllm-router.service") == ROUTER_UNIT
        assert on(HOST, "cat /etc/vllm/router.yaml").strip() == "routes: []"
        current = json.loads(on(HOST, f"{H} show"))["current"]
        assert "router" not in current["created"] and "router.yaml" not in current["files"]
    finally:
        on(HOST, "rm -f /etc/systemd/system/vllm-router.service /etc/vllm/router.yaml; "
                 "systemctl daemon-reload")
