"""Benchmark every host's local vLLM with `vllm bench serve`, then sweep max-num-batched-tokens on
transient trial servers; no host is changed: `pyinfra INVENTORY deploys/bench.py` (on the lab:
`pyinfra fleetlab/inventories/lab.py deploys/bench.py`).

Settings: host data `vllm_bench` or VLLM_FLEET_BENCH_* (vllm_fleet/core/benchmark.py); the table is printed
last.
"""

from vllm_fleet import bench_vllm

bench_vllm()
