"""Only the install part of deploys/vllm.py: the host's base and its release (from the controller's
wheel cache, filled first if empty). Used by bench/install_reuse.py; no config, no restart."""

from pyinfra import host

from roles import install
from roles.facts import VllmHost
from roles.vllm import plan_without_secrets

plan = plan_without_secrets()
vh = host.get_fact(VllmHost)
install.base(vh["base_ok"])
install.release(plan, vh["releases"])
