"""The Grafana dashboard and Prometheus rules for the inventory's releases, changing nothing on the
hosts: `VLLM_FLEET_DASHBOARDS='{"output": "DIR"}' pyinfra INVENTORY deploys/dashboards.py`
(`vllm-fleet dashboards`)."""

from vllm_fleet import write_vllm_dashboards

write_vllm_dashboards()
