"""Another deploy of the same inventory, for the hosts that are not vLLM hosts (the mixed-inventory
test runs it beside deploys/vllm.py in one pyinfra run): an ordinary pyinfra operation, through the
host's own login and sudo."""

from pyinfra import host
from pyinfra.operations import files

from vllm_fleet.core.spec import is_vllm_host

if not is_vllm_host(host.data.get("vllm")):
    files.line(name="database role marker", path="/etc/lab-role", line="role=database")
