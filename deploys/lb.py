"""haproxy in front of the fleet, on the inventory's hosts with `vllm_lb` data:
`pyinfra INVENTORY deploys/vllm.py deploys/lb.py` (docs/operations.md#a-load-balancer)."""

from vllm_fleet import deploy_vllm_balancer

deploy_vllm_balancer()
