"""Deploy vLLM to every host in the inventory: `pyinfra inventories/lab.py deploys/vllm.py`."""

from vllm_fleet.roles.vllm import deploy_vllm

deploy_vllm()
