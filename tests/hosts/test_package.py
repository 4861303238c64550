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
    # wheel and sdist as a release builds them (PEP 517, isolated); byte-compiling left to the installer
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    build = subprocess.run([sys.executable, "-m", "build", "-o", str(dist), str(ROOT)], capture_output=True,
                           text=True, timeout=600, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    warnings = [ln for ln in (build.stdout + build.stderr).splitlines() if "warning" in ln.lower()]
    assert warnings == [], warnings
    wheel = next(dist.glob("vllm_fleet-*.whl"))
    sdist = next(dist.glob("vllm_fleet-*.tar.gz"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True,
                         text=True, timeout=900)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    # `python -m build` made the wheel from the sdist, so the sdist carries what the wheel installs
    import tarfile

    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        held = set(tar.getnames())
    assert {f"{top}/roles/vllm.py", f"{top}/templates/vllm.service.j2", f"{top}/LICENSE",
            f"{top}/CHANGELOG.md"} <= held, sorted(held)[:40]
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


def test_the_installed_command_line_is_the_products(installed):
    """--version is the package's; the lab's commands belong to the checkout, not to the wheel."""
    from vllm_fleet import __version__

    venv, work, _ = installed
    version = run(venv, work, "vllm-fleet", "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"vllm-fleet {__version__}", version
    helped = run(venv, work, "vllm-fleet", "--help")
    assert helped.returncode == 0, helped.stderr
    commands = helped.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert "lab" not in commands and "model" not in commands, helped.stdout
    assert {"plan", "stage", "rollout", "status", "rollback", "explain"} <= set(commands), helped.stdout
    lab = run(venv, work, "vllm-fleet", "lab", "up", "1")
    assert lab.returncode == 2 and "invalid choice: 'lab'" in lab.stderr, lab.stdout + lab.stderr
    explained = run(venv, work, "vllm-fleet", "explain", "max_num_seqs")
    assert explained.returncode == 0 and "vllm serve --max-num-seqs" in explained.stdout, explained


def test_a_users_deploy_file_composes_the_public_api_with_other_operations(installed, deployed):
    """A deploy file as a pyinfra user writes one: an operation of pyinfra's own, then the package's deploy,
    imported from the top of the package. --dry runs the deploy's whole collection on lab1 and changes
    nothing; pyinfra's change detection (shown without -y) lists the other operation beside it."""
    venv, work, _ = installed
    (work / "site.py").write_text(
        "from pyinfra.operations import server\n"
        "from vllm_fleet import deploy_vllm\n\n"
        "server.shell(name='site: say hello', commands=['echo hello from site.py'])\n"
        "deploy_vllm()\n")
    dry = run(venv, work, "pyinfra", "--dry", "--limit", "lab1", "inventory.py", "site.py")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0 and "Traceback" not in out, out[-4000:]
    table = out.split("--> Detected changes:", 1)[1].split("\n\n", 1)[0]
    assert "site: say hello" in table, table
    assert "vLLM | smoke test vllm-default.service" in table, table
