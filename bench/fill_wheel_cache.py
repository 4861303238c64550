"""Fill the controller's store with the lock of the inventory's release for the host's target, without
touching the host: the download a fleet makes once per release and target, kept out of
bench/install_reuse.py's timed install."""

from pyinfra import host

from vllm_fleet.roles.facts import VllmHost
from vllm_fleet.roles.hostplan import plan_without_secrets
from vllm_fleet.roles.install import fill_cache

fill_cache(plan_without_secrets(), host.get_fact(VllmHost))
