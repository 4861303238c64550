"""The lab: local systemd hosts booted by `vllm-fleet lab up N`, serving the tiny model on the CPU.

Reads the lab's state file, so it always lists the hosts that are up. The model is made locally by
`vllm-fleet model tiny` (no hub downloads); the API key comes from VLLM_API_KEY in your environment.
"""

from fleetlab.inventory import lab_hosts

lab = lab_hosts()
