"""Issue 4's refusals through the real deploy: every bad inventory of tests/unit/bad_inventories.py,
given to lab2, makes `pyinfra ... deploys/vllm.py` exit non-zero naming the host and the field, before
any operation runs, and leaves both lab hosts' files as they were."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.conftest import INVENTORY, ROOT, deploy, host_files_digest

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
    return {h: host_files_digest(h) for h in ("lab1", "lab2")}


@pytest.mark.parametrize(("desc", "data", "path", "words"), BAD_HOSTS, ids=[b[0] for b in BAD_HOSTS])
def test_bad_inventory_is_refused_before_anything_changes(before, desc, data, path, words):
    run = deploy(overrides={"__replace__": {"lab2": data}})
    assert run.rc != 0
    lines = [line.strip() for line in run.output.splitlines() if line.strip().startswith("lab2: vllm.")]
    wanted = path if path.startswith("vllm") else f"vllm.{path}"
    hit = [line for line in lines if line.split(": ", 2)[1].startswith(wanted)]
    assert hit, (wanted, lines)
    assert all(w.lower() in hit[0].lower() for w in words), (words, hit[0])
    assert "Beginning operation run" not in run.output
    assert host_files_digest("lab2") == before["lab2"]


def test_no_lab_host_changed_after_all_refusals(before):
    assert {h: host_files_digest(h) for h in ("lab1", "lab2")} == before


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
    assert {h: host_files_digest(h) for h in ("lab1", "lab2")} == before
