"""The plain-data examples in inventories/ stay plain, valid and what the README shows.

Each file is loaded by pyinfra's own inventory loader, so group_data/all.py beside it is merged in as
pyinfra merges it (its variables become data of every host); every vLLM host's `vllm` data, over the
`vllm_defaults` it gets from there, passes the schema's validation (parse_inventory, as the deploy reads
host.data); the 8-GPU hosts use all eight GPUs in one parallel group that divides the model's heads.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import Config, State
from pyinfra.context import ctx_config, ctx_state
from pyinfra_cli.inventory import make_inventory

import fleetlab as lab
from fleetlab.inventory import connection
from vllm_fleet.core.spec import HostSpec, is_vllm_host, parse_inventory

ROOT = Path(__file__).resolve().parents[2]
INVENTORIES = ROOT / "inventories"
EXAMPLES = sorted(INVENTORIES.glob("*.py"))
EVERY_FILE = sorted(p for p in INVENTORIES.rglob("*.py") if "__pycache__" not in p.parts)
MODEL_CONFIGS = ROOT / "tests" / "fixtures" / "model_configs"
README = (ROOT / "README.md").read_text()
# the examples' 8-GPU servers, by file
EIGHT_GPU_HOSTS = {"gpu_fleet.py": ["gpu01", "gpu02", "gpu03", "gpu04"]}
PROJECT_MODULES = ("vllm_fleet", "fleetlab", "tests")


def _load(path: Path) -> dict[str, dict[str, Any]]:
    """Each host's data as `pyinfra PATH ...` gives it to a deploy, group data included."""
    with ctx_state.use(State()), ctx_config.use(Config()):
        inventory = make_inventory(str(path), cwd=str(path.parent))
    return {host.name: host.data.dict() for host in inventory}


def _specs(path: Path) -> dict[str, HostSpec]:
    hosts = _load(path)
    return parse_inventory((name, data.get("vllm"), data.get("vllm_defaults"))
                           for name, data in hosts.items())


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(INVENTORIES)) for p in paths]


def test_the_gpu_fleet_example_and_its_group_data_are_there():
    assert INVENTORIES / "gpu_fleet.py" in EXAMPLES
    assert INVENTORIES / "group_data" / "all.py" in EVERY_FILE


@pytest.mark.parametrize("path", EVERY_FILE, ids=_ids(EVERY_FILE))
def test_an_example_imports_nothing_of_this_project_or_the_lab(path: Path):
    """An operator copies these files to a machine that has only the wheel: plain data."""
    text = path.read_text()
    assert "fleetlab" not in text, f"{path.name} names the lab: the lab's inventories are in fleetlab/"
    for node in ast.walk(ast.parse(text)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        assert not [n for n in names if n.split(".")[0] in PROJECT_MODULES], f"{path.name} imports {names}"


def test_group_data_restates_no_default():
    """group_data/all.py holds the fleet's own choices: a value equal to the schema's default is noise
    that hides which settings the fleet chose."""
    scope: dict[str, Any] = {}
    exec((INVENTORIES / "group_data" / "all.py").read_text(), scope)
    defaults = scope["vllm_defaults"]
    bare = parse_inventory([("h", {"model": {"name": "m", "path": "/m"}}, None)])["h"]
    inst = bare.instances[0]
    given = [(key, value, getattr(bare if key in HostSpec.model_fields else inst, key))
             for key, value in defaults.items() if key not in ("flags", "model")]
    given += [(f"flags.{flag}", value, getattr(inst.flags, flag))
              for flag, value in defaults.get("flags", {}).items()]
    for key, value, default in given:
        assert value != default, f"vllm_defaults.{key} restates the default {default!r}"


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_every_example_is_valid_with_its_group_data(path: Path):
    hosts = _load(path)
    assert hosts, f"{path.name} declares no host"
    assert all("vllm_defaults" in data for data in hosts.values()), "group_data/all.py was not merged"
    specs = _specs(path)  # raises SpecError with every problem, host and field path
    assert sorted(specs) == sorted(n for n, d in hosts.items() if is_vllm_host(d.get("vllm")))


def test_the_group_data_reaches_every_host_of_the_gpu_fleet():
    specs = _specs(INVENTORIES / "gpu_fleet.py")
    assert sorted(specs) == EIGHT_GPU_HOSTS["gpu_fleet.py"]
    for spec in specs.values():
        inst = spec.instances[0]
        assert (spec.version, spec.install_source, inst.model.hf_repo, inst.api_key_env, inst.flags.host) == (
            "0.33.0", "registry", "meta-llama/Llama-3.1-70B-Instruct", "FLEET_API_KEY", "0.0.0.0")


@pytest.mark.parametrize(("file", "host"), [(f, h) for f, hosts in EIGHT_GPU_HOSTS.items() for h in hosts])
def test_an_8_gpu_host_uses_its_8_gpus_in_one_parallel_group(file: str, host: str):
    spec = _specs(INVENTORIES / file)[host]
    for inst in spec.instances:
        gpus = inst.gpus if isinstance(inst.gpus, int) else len(inst.gpus or [])
        assert gpus == 8, f"{host}: instance {inst.name} declares {inst.gpus!r} GPUs"
        tp, pp = inst.flags.tensor_parallel_size, inst.flags.pipeline_parallel_size
        assert tp is not None and tp * pp == gpus, f"{host}: TP {tp} x PP {pp} on {gpus} GPUs"
        # the plan refuses a TP that does not divide the heads; the fixture is the model's real config.json
        config = MODEL_CONFIGS / f"{(inst.model.hf_repo or '').split('/')[-1]}.json"
        if config.exists():
            heads = json.loads(config.read_text())
            assert heads["num_attention_heads"] % tp == 0 and heads["num_key_value_heads"] % tp == 0


def test_the_gpu_fleet_logs_in_like_the_lab():
    """The lab's hosts log in with the same keys (tests/hosts/test_logins.py proves that shape on real
    hosts)."""
    lab_login = connection(lab.LabHost(1))
    for name, data in _load(INVENTORIES / "gpu_fleet.py").items():
        for key in ("ssh_user", "_sudo", "ssh_strict_host_key_checking"):
            assert data.get(key) == lab_login[key], (name, key)
        assert data.get("ssh_known_hosts_file"), name


@pytest.mark.parametrize("path", [INVENTORIES / "gpu_fleet.py", INVENTORIES / "group_data" / "all.py"],
                         ids=["gpu_fleet.py", "group_data/all.py"])
def test_the_readme_shows_the_example_as_it_is(path: Path):
    name = path.relative_to(ROOT).as_posix()
    block = re.search(rf"```python\n# {re.escape(name)}\n(.*?)```", README, re.S)
    assert block, f"README lost its copy of {name}"
    assert block.group(1) == path.read_text(), f"README's copy of {name} differs from the file"
