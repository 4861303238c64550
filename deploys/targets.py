"""Prometheus file_sd targets from the inventory, changing nothing on the hosts:
`VLLM_FLEET_TARGETS_OUTPUT=FILE pyinfra INVENTORY deploys/targets.py` (`vllm-fleet targets`)."""

from vllm_fleet import write_vllm_targets

write_vllm_targets()
