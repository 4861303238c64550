"""The rendered units as systemd itself scores them (`systemd-analyze security --offline=yes`)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.rendered_units import render_units

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")


def score(path) -> float:
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(path)], capture_output=True,
                         text=True)
    return float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout).group(1))


@pytest.mark.parametrize("kind", ["cpu", "gpu", "cluster-worker", "watchdog"])
def test_units_score_well_in_systemd_analyze_security(tmp_path, kind):
    unit = tmp_path / f"vllm-{kind}.service"
    unit.write_text(render_units()[kind])
    value = score(unit)
    print(f"systemd-analyze security, {kind} unit: {value}")
    assert value <= 3.0


def test_stock_unit_scores_badly_for_comparison(tmp_path):
    """The bar the hardened units are measured against: a plain unit scores about 9.6."""
    unit = tmp_path / "plain.service"
    unit.write_text("[Service]\nExecStart=/usr/bin/true\n")
    assert score(unit) >= 9.0


@pytest.mark.parametrize("kind", ["cpu", "gpu", "cluster-worker", "watchdog"])
def test_units_get_their_own_mount_namespace(kind):
    """PrivateMounts=: mounts made inside the unit stay there, and the host's later ones do not leak in."""
    assert "\nPrivateMounts=yes\n" in render_units()[kind]
