"""Prometheus file_sd targets from the inventory, changing nothing on the hosts:
`VLLM_FLEET_TARGETS_OUTPUT=FILE pyinfra inventories/lab.py deploys/targets.py` (`vllm-fleet targets`)."""

from vllm_fleet.roles.targets import targets

targets()
