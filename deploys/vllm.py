"""Deploy vLLM to every host in the inventory: `pyinfra inventories/gpu_fleet.py deploys/vllm.py`;
on the lab: `pyinfra fleetlab/inventories/lab.py deploys/vllm.py`."""

from vllm_fleet import deploy_vllm

deploy_vllm()
