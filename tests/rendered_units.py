"""Units exactly as the deploy renders them: a CPU lab host, a GPU host (2x H100, GPUs 0, 1) and a worker
node of a two-node cluster (the same GPUs).

The GPU host is described literally here (no GPU on this machine); rendering runs in a subprocess so
the planner's imports stay those of a deploy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def render_units() -> dict[str, str]:
    """The deploy's own rendering for a CPU lab host and a GPU host (2x H100, GPUs 0 and 1)."""
    code = r"""
import json
from vllm_fleet.core import render
from vllm_fleet.core.gpus import DriverVersion, Gpu
from fleetlab.inventory import lab_vllm
from vllm_fleet.core.plan import HostFacts, plan_host
from vllm_fleet.core.spec import parse_host
env = {"VLLM_API_KEY": "k"}
cpu = plan_host("lab1", parse_host("lab1", lab_vllm(1)), HostFacts(), env)
gpus = tuple(Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 81559, (9, 0), f"0:{i}", minor=i) for i in range(2))
g = parse_host("gpu1", {"model": {"name": "m", "host_path": "/opt/vllm/models/m"}})
gpu = plan_host("gpu1", g, HostFacts(gpus=gpus, driver=DriverVersion.parse("580.105.08")), env)
from vllm_fleet.core.cluster import resolve
nodes = {n: parse_host(n, {"model": {"name": "m", "host_path": "/opt/vllm/models/m"},
                           "cluster": {"name": "big", "nodes": ["gpu1", "gpu2"], "address": a}})
         for n, a in (("gpu1", "10.0.0.1"), ("gpu2", "10.0.0.2"))}
role = resolve(nodes, {})["gpu2"]
w = plan_host("gpu2", nodes["gpu2"], HostFacts(gpus=gpus, driver=DriverVersion.parse("580.105.08"),
                                               interfaces={"10.0.0.2": "ens5"}), env, node=role)
print(json.dumps({"cpu": render.unit(cpu, cpu.instances[0]), "gpu": render.unit(gpu, gpu.instances[0]),
                  "cluster-worker": render.unit(w, w.instances[0]),
                  "watchdog": render.watchdog_units(cpu.instances[0])[0],
                  "watchdog-timer": render.watchdog_units(cpu.instances[0])[1]}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
