"""Smoke-test what is deployed, changing nothing: `pyinfra inventories/lab.py deploys/smoke.py`."""

from roles.vllm import smoke_only

smoke_only()
