"""Fill the controller's wheel cache for the inventory's release without touching the host:
the download a fleet makes once per release, kept out of bench/install_reuse.py's timed install."""

from vllm_fleet.deploy.install import fill_cache
from vllm_fleet.deploy.vllm import plan_without_secrets

fill_cache(plan_without_secrets())
