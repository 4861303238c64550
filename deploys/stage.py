"""Stage the next deploy without touching what serves: `pyinfra INVENTORY deploys/stage.py`
builds the release from its lock, stages or fetches each model and validates each config with that
release; the deploy after it only switches and restarts."""

from vllm_fleet import stage_vllm

stage_vllm()
