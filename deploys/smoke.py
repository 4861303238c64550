"""Smoke-test what is deployed, changing nothing: `pyinfra inventories/lab.py deploys/smoke.py`."""

from vllm_fleet.roles.vllm import smoke_only

smoke_only()
