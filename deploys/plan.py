"""What each host would get and why, changing nothing: `vllm-fleet plan INVENTORY` runs this."""

from vllm_fleet import plan_vllm

plan_vllm()
