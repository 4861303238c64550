"""Tune one instance over a grid of knobs and write a report (`vllm-fleet tune`, which sets
VLLM_FLEET_TUNE); the instance is drained, stopped for the trials and restored; the inventory is never
edited."""

from vllm_fleet import tune_vllm

tune_vllm()
