"""The journal's last lines of every vLLM instance, changing nothing: `vllm-fleet logs INVENTORY` runs
this (VLLM_FLEET_LOGS_INSTANCE / VLLM_FLEET_LOGS_LINES for --instance / --lines)."""

from vllm_fleet import tail_vllm_logs

tail_vllm_logs()
