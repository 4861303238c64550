"""Benchmark every host's local vLLM with `vllm bench serve`, then sweep max-num-batched-tokens on
transient trial servers; no host is changed: `pyinfra inventories/lab.py deploys/bench.py`.

Settings: host data `vllm_bench` or VLLM_FLEET_BENCH_* (vllm_fleet/core/benchmark.py); the table is printed
last.
"""

from vllm_fleet.roles.bench import bench

bench()
