"""Fill the controller's wheel cache for the inventory's release without touching the host:
the download a fleet makes once per release, kept out of bench/install_reuse.py's timed install."""

from roles.install import fill_cache
from roles.vllm import plan_without_secrets

fill_cache(plan_without_secrets())
