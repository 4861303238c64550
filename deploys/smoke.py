"""Smoke-test what is deployed, changing nothing: `pyinfra INVENTORY deploys/smoke.py`
(`vllm-fleet status INVENTORY` runs it); on the lab:
`pyinfra fleetlab/inventories/lab.py deploys/smoke.py`."""

from vllm_fleet import check_vllm

check_vllm()
