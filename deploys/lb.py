"""haproxy in front of the fleet, on the inventory's hosts with `vllm_lb` data:
`pyinfra inventories/prod.py deploys/vllm.py deploys/lb.py` (docs/operations.md#a-load-balancer)."""

from vllm_fleet.roles.lb import deploy_lb

deploy_lb()
