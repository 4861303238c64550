"""Only the install part of deploys/vllm.py: the host's base and its release (from the controller's
store, filled first if empty). Used by bench/install_reuse.py; no config, no restart."""

from pyinfra import host

from vllm_fleet.roles import install
from vllm_fleet.roles.facts import VllmHost
from vllm_fleet.roles.hostplan import plan_without_secrets

plan = plan_without_secrets()
vh = host.get_fact(VllmHost)
install.base(vh)
install.release(plan, vh)
