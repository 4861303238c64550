"""Fill the controller's wheel cache (and bundle) for the inventory's release without touching the host:
the download a fleet makes once per release, kept out of bench/install_reuse.py's timed install."""

from roles.install import prepare_bundle
from roles.vllm import plan_without_secrets

prepare_bundle(plan_without_secrets())
