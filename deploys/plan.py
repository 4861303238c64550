"""What each host would get and why, changing nothing: `vllm-fleet plan INVENTORY` runs this."""

from vllm_fleet.roles.vllm import plan_report

plan_report()
