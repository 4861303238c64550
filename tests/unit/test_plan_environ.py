"""plan, stage, deploy, targets and bench plan from one environment: the controller's. Before, the
read-only commands planned from the secrets' placeholders alone, so the index settings the deploy reads
(VLLM_FLEET_VARIANT_INDEXES, VLLM_FLEET_FIND_LINKS) were ignored and another lock was resolved."""

from __future__ import annotations

import os

from vllm_fleet.core.environment import index_settings
from vllm_fleet.core.spec import parse_inventory
from vllm_fleet.core.variants import load_table
from vllm_fleet.roles.hostplan import controller_environ


def test_the_plan_keeps_the_controllers_settings_and_fills_only_the_secrets_that_are_missing(monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_FIND_LINKS", "/srv/wheels")
    monkeypatch.setenv("VLLM_FLEET_VARIANT_INDEXES", "0")
    monkeypatch.setenv("TEAM_KEY", "sk-real-value")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    spec = parse_inventory([("gpu-01", {"model": {"name": "m", "hf_repo": "org/m"}, "api_key_env": "TEAM_KEY",
                                        "hf_token_env": "HF_TOKEN", "accelerator": "cpu"}, None)])["gpu-01"]
    env = controller_environ(spec)
    assert env["TEAM_KEY"] == "sk-real-value" and env["HF_TOKEN"] == "-"
    assert env["VLLM_FLEET_FIND_LINKS"] == "/srv/wheels" and env["VLLM_FLEET_VARIANT_INDEXES"] == "0"
    build = next(v for row in load_table().values() for v in row.values() if v.accelerator == "cpu")
    deploys = index_settings(build, spec, {**os.environ, "HF_TOKEN": "hf_x"})
    assert index_settings(build, spec, env) == deploys
    assert "/srv/wheels" in str(deploys)
