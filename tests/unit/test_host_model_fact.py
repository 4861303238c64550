"""The HostModel fact's script (it runs on hosts) against a real model directory, here in a shell."""

from __future__ import annotations

import subprocess

from fleetlab.tinymodel import make_tiny_model
from vllm_fleet.core.modelinfo import weight_bytes_from_dir
from vllm_fleet.roles.facts import HostModel


def run(path: str) -> dict:
    fact = HostModel()
    out = subprocess.run(["sh", "-c", fact.command(path)], capture_output=True, text=True, timeout=60)
    return fact.process(out.stdout.splitlines())


def test_reads_config_and_weight_bytes_like_the_controller_does(tmp_path):
    model = make_tiny_model(tmp_path / "tiny")
    found = run(str(model))
    assert found["config"]["num_attention_heads"] == 4
    assert found["config"]["num_key_value_heads"] == 2
    assert found["weight_bytes"] == weight_bytes_from_dir(model)


def test_a_missing_directory_gives_nothing_rather_than_failing(tmp_path):
    assert run(str(tmp_path / "nope")) == {"config": None, "weight_bytes": None}
