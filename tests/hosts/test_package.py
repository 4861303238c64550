"""The wheel is the product: built from the checkout, installed into a clean venv, used from a directory
that is not the checkout, against the lab (issue 20, item 1).

An inventory written out as plain data stands for a user's: it imports nothing of the checkout, so the
run proves the installed package carries its templates, data table and host-side scripts, and that the
lab (fleetlab/) is not needed by anything the product runs.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from fleetlab.inventory import lab_hosts as lab_inventory
from tests.hosts.conftest import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory, lab_hosts):
    tmp = tmp_path_factory.mktemp("package")
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600)
    wheel = next(dist.glob("vllm_fleet-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True,
                         text=True, timeout=900)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    work = tmp / "work"
    work.mkdir()
    hosts = [(name, data) for name, data in lab_inventory() if name in lab_hosts or "vllm" not in data]
    text = f"lab = {hosts!r}\n"
    assert ast.literal_eval(text.split("=", 1)[1].strip()) == hosts  # plain data, no import
    (work / "inventory.py").write_text(text)
    return venv, work, wheel


def run(venv, work, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=work, text=True, capture_output=True,
                          env={**clean, **(env or {})}, timeout=900)


def test_the_wheel_holds_the_product_and_not_the_lab(installed):
    import zipfile

    _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "vllm_fleet/templates/vllm.service.j2" in names and "vllm_fleet/data/variants.toml" in names
    assert "vllm_fleet/host/hoststate.py" in names and "vllm_fleet/host/keyguard.py" in names
    assert "vllm_fleet/roles/vllm.py" in names and "vllm_fleet/core/plan.py" in names
    assert not [n for n in names if n.startswith(("fleetlab/", "tests/", "bench/"))], names


def test_the_installed_package_plans_the_lab_from_another_directory(installed, deployed):
    venv, work, _ = installed
    where = run(venv, work, "python", "-c", "import vllm_fleet; print(vllm_fleet.__file__)")
    assert where.returncode == 0 and str(ROOT) not in where.stdout, where.stdout + where.stderr
    assert "site-packages" in where.stdout
    plan = run(venv, work, "vllm-fleet", "plan", "inventory.py")
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert "0.32.0-cpu" in plan.stdout and "lab1" in plan.stdout, plan.stdout[-3000:]


def test_the_installed_package_renders_every_file_of_a_converged_host(installed, deployed):
    """--dry without -y renders the serve config, env files and unit from the wheel's templates and
    compares them with the host's: a template or a script missing from the wheel fails here."""
    venv, work, _ = installed
    dry = run(venv, work, "pyinfra", "--dry", "--limit", "lab1", "inventory.py",
              "vllm_fleet.roles.vllm.deploy_vllm")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    # converged: pyinfra's change detection finds nothing to change, the smoke test included
    table = out.split("--> Detected changes:", 1)[1].split("\n\n", 1)[0]
    assert "smoke test vllm-default.service" in table and "(lab1)" not in table, table


def test_the_lab_says_where_it_lives_when_run_from_the_wheel(installed):
    venv, work, _ = installed
    lab = run(venv, work, "vllm-fleet", "lab", "up", "1")
    assert lab.returncode != 0
    assert "come with the source checkout" in lab.stderr, lab.stdout + lab.stderr
