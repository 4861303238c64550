"""The lab inventory with per-test overrides (VLLM_FLEET_TEST_OVERRIDES: {"lab2": {...vllm...}}).

{"__replace__": {"lab2": {...}}} puts a whole vllm dict in place of the lab's (bad-inventory tests);
{"__hostdata__": {"lab1": {"ssh_user": "nosudo"}}} adds or changes other host data (the login tests,
the load balancer's `vllm_lb`).

Only the hosts the tests booted are in it (VLLM_FLEET_TEST_HOSTS, default the session's lab1, lab2 and
the plain lab8), whatever else is up: a lab left with more hosts by `vllm-fleet lab up 4` or a bench is
not the tests' fleet. A module that boots more hosts names them (tests/hosts/test_rollout.py).
"""

import json
import os

from fleetlab.inventory import lab_hosts
from vllm_fleet.core.spec import deep_merge

_over = json.loads(os.environ.get("VLLM_FLEET_TEST_OVERRIDES", "{}"))
_replace = _over.pop("__replace__", {})
_hostdata = _over.pop("__hostdata__", {})
HOSTS_ENV, DEFAULT_HOSTS = "VLLM_FLEET_TEST_HOSTS", "lab1,lab2,lab8"
_only = set(os.environ.get(HOSTS_ENV, DEFAULT_HOSTS).split(","))


def _vllm(name: str, data: dict) -> dict:
    if name in _replace:
        return {"vllm": _replace[name]}
    if "vllm" not in data:
        return {}
    over = _over.get(name, {})
    merged = deep_merge(data["vllm"], over)
    if merged.get("accelerator") == "cuda" and "dtype" not in over.get("flags", {}):
        # the lab's float16 works around the CPU build's AMX attention kernel (fleetlab.inventory); a
        # host simulating a GPU plans like a fleet's, with the dtype its compute capability picks
        merged["flags"] = {k: v for k, v in merged["flags"].items() if k != "dtype"}
    if merged.get("accelerator") == "cuda" and "distributed_executor_backend" not in over.get("flags", {}):
        # likewise the CPU lab's single-process executor: a GPU host with several GPUs runs vLLM's default
        merged["flags"] = {k: v for k, v in merged["flags"].items() if k != "distributed_executor_backend"}
    return {"vllm": merged}


lab = [(name, {**{k: v for k, v in data.items() if k != "vllm"}, **_hostdata.get(name, {}),
               **_vllm(name, data)})
       for name, data in lab_hosts() if name in _only]
