"""vllm-fleet: pyinfra deploys that keep a fleet of vLLM servers on the right build, model and flags.

The public API is the deploys below, used as any pyinfra ``@deploy`` in a deploy file of your own::

    from pyinfra.operations import server
    from vllm_fleet import deploy_vllm

    server.packages(name="monitoring agent", packages=["prometheus-node-exporter"])
    deploy_vllm()

    # pyinfra inventory.py my_deploy.py

Each one's docstring lists the host data and environment variables it reads. They are imported on first
use, so importing the package (or the pure core under ``vllm_fleet.core``) loads no pyinfra deploy.
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = metadata.version("vllm-fleet")
except metadata.PackageNotFoundError:  # not installed: no metadata (a checkout needs `pip install -e .`)
    __version__ = "0+unknown"

# public name -> (module, its name there)
_DEPLOYS = {
    "deploy_vllm": ("vllm_fleet.roles.vllm", "deploy_vllm"),
    "stage_vllm": ("vllm_fleet.roles.vllm", "stage_vllm"),
    "plan_vllm": ("vllm_fleet.roles.vllm", "plan_vllm"),
    "check_vllm": ("vllm_fleet.roles.vllm", "check_vllm"),
    "rollback_vllm": ("vllm_fleet.roles.rollback", "rollback_vllm"),
    "tail_vllm_logs": ("vllm_fleet.roles.logs", "tail_vllm_logs"),
    "write_vllm_targets": ("vllm_fleet.roles.targets", "write_vllm_targets"),
    "write_vllm_dashboards": ("vllm_fleet.roles.targets", "write_vllm_dashboards"),
    "tune_vllm": ("vllm_fleet.roles.tune", "tune_vllm"),
    "bench_vllm": ("vllm_fleet.roles.bench", "bench_vllm"),
    "deploy_vllm_balancer": ("vllm_fleet.roles.lb", "deploy_vllm_balancer"),
}

__all__ = [
    "__version__",
    "bench_vllm",
    "check_vllm",
    "deploy_vllm",
    "deploy_vllm_balancer",
    "plan_vllm",
    "rollback_vllm",
    "stage_vllm",
    "tail_vllm_logs",
    "tune_vllm",
    "write_vllm_dashboards",
    "write_vllm_targets",
]

if TYPE_CHECKING:
    from vllm_fleet.roles.bench import bench_vllm
    from vllm_fleet.roles.lb import deploy_vllm_balancer
    from vllm_fleet.roles.logs import tail_vllm_logs
    from vllm_fleet.roles.rollback import rollback_vllm
    from vllm_fleet.roles.targets import write_vllm_dashboards, write_vllm_targets
    from vllm_fleet.roles.tune import tune_vllm
    from vllm_fleet.roles.vllm import check_vllm, deploy_vllm, plan_vllm, stage_vllm


def __getattr__(name: str) -> Any:
    if name not in _DEPLOYS:
        raise AttributeError(f"module 'vllm_fleet' has no attribute {name!r}")
    module, attr = _DEPLOYS[name]
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
