"""Issue 9, first part, on a real host: two vLLM instances on one lab host, then one removed."""

from __future__ import annotations

import json

from tests.hosts.conftest import api_get, deploy, on, unit_props

TWO = {"lab2": {"instances": [{"name": "default"}, {"name": "second", "flags": {"port": 8001}}]}}


def test_two_instances_serve_and_removing_one_leaves_the_other_running(deployed):
    run = deploy(overrides=TWO)
    assert run.rc == 0, run.output[-4000:]
    lab2 = {r["instance"]: r for r in run.smoke if r["host"] == "lab2"}
    assert set(lab2) == {"default", "second"} and all(r["ok"] for r in lab2.values())
    assert unit_props("lab2", "vllm-second.service")["ActiveState"] == "active"
    status, body = api_get("lab2", "/v1/models", instance="second", port=8001)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny-llama"
    assert on("lab2", "stat -c %a /etc/vllm/second.env").strip() == "600"

    kept = unit_props("lab2")["MainPID"]
    run = deploy()
    assert run.rc == 0, run.output[-4000:]
    assert "instance second is no longer in the inventory: removing vllm-second.service" in run.output
    assert on("lab2", "ls /etc/systemd/system/vllm-second.service /etc/vllm/second.yaml "
                      "/etc/vllm/second.env 2>&1 | grep -c 'No such file'").strip() == "3"
    assert unit_props("lab2", "vllm-second.service").get("ActiveState") in ("inactive", None)
    assert unit_props("lab2")["MainPID"] == kept
