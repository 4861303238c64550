"""Issue 4's refusals through the real deploy: every bad inventory of tests/unit/bad_inventories.py,
given to a lab host, makes `pyinfra ... deploys/vllm.py` exit non-zero naming the host and the field,
before any operation runs, and leaves both lab hosts' files as they were."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.conftest import INVENTORY, ROOT, Run, deploy, host_files_digest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from bad_inventories import BAD_HOSTS  # noqa: E402

# the tiny model beside a file whose name holds a newline (made by the `before` fixture)
ODD_MODEL = str(ROOT / ".cache" / "odd-names-model")


@pytest.fixture(scope="module")
def before(deployed):
    import shutil

    from fleetlab.inventory import TINY_MODEL

    shutil.rmtree(ODD_MODEL, ignore_errors=True)
    shutil.copytree(TINY_MODEL, ODD_MODEL)
    Path(ODD_MODEL, "notes\nfor the team.txt").write_text("a name no loader reads\n")
    return {h: host_files_digest(h) for h in ("lab1", "lab2", "lab8")}


# Every lab host of the tests' inventory carries one bad inventory per run (the plain lab8 too), so a
# run proves three refusals: each host's own, printed side by side before anything runs anywhere.
CARRIERS = ("lab2", "lab1", "lab8")


@pytest.fixture(scope="module")
def refused_runs(before):
    runs: dict[int, Run] = {}

    def run_for(i: int) -> tuple[str, Run]:
        batch, host = divmod(i, len(CARRIERS))
        if batch not in runs:
            cases = BAD_HOSTS[batch * len(CARRIERS):(batch + 1) * len(CARRIERS)]
            carried = {h: c[1] for h, c in zip(CARRIERS, cases, strict=False)}  # the last batch: fewer
            runs[batch] = deploy(overrides={"__replace__": carried})
        return CARRIERS[host], runs[batch]

    return run_for


@pytest.mark.parametrize(("i", "desc", "data", "path", "words"), [(i, *b) for i, b in enumerate(BAD_HOSTS)],
                         ids=[b[0] for b in BAD_HOSTS])
def test_bad_inventory_is_refused_before_anything_changes(before, refused_runs, i, desc, data, path, words):
    host, run = refused_runs(i)
    assert run.rc != 0
    lines = [line.strip() for line in run.output.splitlines() if line.strip().startswith(f"{host}: vllm.")]
    wanted = path if path.startswith("vllm") else f"vllm.{path}"
    hit = [line for line in lines if line.split(": ", 2)[1].startswith(wanted)]
    assert hit, (wanted, lines)
    assert all(w.lower() in hit[0].lower() for w in words), (words, hit[0])
    assert "Beginning operation run" not in run.output
    if host in before:
        assert host_files_digest(host) == before[host]


def test_no_lab_host_changed_after_all_refusals(before):
    assert {h: host_files_digest(h) for h in ("lab1", "lab2", "lab8")} == before


# Refused by the planner (from the host's facts and the model's config.json), not by the schema.
PLAN_REFUSED = [
    ("model path missing on the controller", {"model": {"path": "/nonexistent/tiny"}},
     "lab2: vllm.instances[default].model.path: /nonexistent/tiny/config.json does not exist"),
    ("tensor parallel that does not divide the heads", {"flags": {"tensor_parallel_size": 3}},
     "lab2: vllm.instances[default]"),
    ("a model file name with a newline", {"model": {"path": ODD_MODEL}},
     f"lab2: vllm.instances[default].model.path: {ODD_MODEL} holds file names with control characters "
     "('notes\\nfor the team.txt'): rename or remove those files"),
]


@pytest.mark.parametrize(("desc", "over", "words"), PLAN_REFUSED, ids=[p[0] for p in PLAN_REFUSED])
def test_plan_and_deploy_exit_non_zero_for_a_plan_refused_host_and_change_nothing(before, desc, over, words):
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps({"lab2": over})}
    plan = subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "plan", INVENTORY], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=300)
    out = plan.stdout + plan.stderr
    assert plan.returncode != 0, out[-3000:]
    assert words in out, out[-3000:]
    assert re.search(r"^lab1  cpu .* default: tiny-llama", out, re.M), out[-3000:]  # every row printed
    run = deploy(overrides={"lab2": over})
    assert run.rc != 0 and words in run.output, run.output[-3000:]
    assert "nothing was changed" in run.output
    assert {h: host_files_digest(h) for h in ("lab1", "lab2")} == {h: before[h] for h in ("lab1", "lab2")}


def _pair(**per_node: dict) -> dict:
    """lab1 and lab2 as the node group `pair` (fleetlab.inventory.lab_cluster_vllm), each node's data
    deep-merged with per_node[name]; `None` as a value removes that key."""
    from fleetlab.inventory import lab_cluster_vllm
    from vllm_fleet.core.spec import deep_merge

    out = {}
    for i, name in enumerate(("lab1", "lab2")):
        data = deep_merge(lab_cluster_vllm(i, ["lab1", "lab2"]), per_node.get(name, {}))
        out[name] = {k: v for k, v in data.items() if v is not None}
    return {"__replace__": out}


# Node groups (#34 item 6), through the real deploy: refused for the named node and field, nothing changed.
NODE_GROUP_REFUSED = [
    ("master port equal to the serve port",
     _pair(lab1={"cluster": {"master_port": 8000}}, lab2={"cluster": {"master_port": 8000}}),
     "vllm.instances[default].flags.port: 8000 is cluster 'pair''s master_port"),
    ("nodes disagree on the split", _pair(lab2={"cluster": {"split": "pipeline"}}),
     "lab2: vllm.cluster.split: differs from the head lab1's"),
    ("nodes disagree on a flag", _pair(lab2={"flags": {"max_num_seqs": 3}}),
     "lab2: vllm.instances[default].flags: differs from the head lab1's"),
    ("nodes disagree on the environment", _pair(lab2={"env": {"OMP_NUM_THREADS": "1"}}),
     "lab2: vllm.instances[default].env: differs from the head lab1's"),
    ("nodes list the group in another order", _pair(lab2={"cluster": {"nodes": ["lab2", "lab1"]}}),
     "lab2: vllm.cluster.nodes: ['lab2', 'lab1'] differs from lab1's ['lab1', 'lab2']"),
    ("a node the inventory lacks", _pair(lab1={"cluster": {"nodes": ["lab1", "lab2", "lab9"]}},
                                         lab2={"cluster": {"nodes": ["lab1", "lab2", "lab9"]}}),
     "lab1: vllm.cluster.nodes: 'lab9' is not in the inventory"),
    ("a listed node that declares no cluster", _pair(lab2={"cluster": None}),
     "lab2: vllm.cluster: listed as a node of cluster 'pair' but declares no cluster"),
    ("two nodes at one address", _pair(lab1={"cluster": {"address": "10.77.1.2"}},
                                       lab2={"cluster": {"address": "10.77.1.2"}}),
     "lab2: vllm.cluster.address: 10.77.1.2 is already the address of lab1"),
    ("the single-worker executor on a group",
     _pair(lab1={"flags": {"distributed_executor_backend": "uni"}},
           lab2={"flags": {"distributed_executor_backend": "uni"}}),
     "vllm.instances[default].flags.distributed_executor_backend: 'uni', but cluster 'pair' runs vLLM's "
     "multi-node mode, which needs 'mp'"),
]


@pytest.mark.parametrize(("desc", "over", "words"), NODE_GROUP_REFUSED,
                         ids=[n[0] for n in NODE_GROUP_REFUSED])
def test_a_bad_node_group_is_refused_before_anything_changes(before, desc, over, words):
    run = deploy(overrides=over, limit="lab1,lab2")
    assert run.rc != 0 and words in run.output, run.output[-3000:]
    # refused while the inventory is read, or by the plan (its own failing step), never past it
    assert "Beginning operation run" not in run.output or "nothing was changed" in run.output
    assert {h: host_files_digest(h) for h in ("lab1", "lab2")} == {h: before[h] for h in ("lab1", "lab2")}
