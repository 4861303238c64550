"""DeviceAllow=/dev/nvidia<minor>: GPUs get the driver's device minor, not nvidia-smi's index.

Captures (tests/fixtures/nvidia/INDEX.md): a real 4x A100 host whose indexes 0-3 carry Minor Numbers 3-6
(its -q fragment and plain table), and a real /proc/driver/nvidia/gpus/*/information pair. PERMUTED below
is derived from the A100 fragment: only its four "Minor Number" values are changed (68:00 -> 5,
9E:00 -> 3, C2:00 -> 6, D4:00 -> 4), because nvidia-smi orders GPUs by PCI bus while the driver numbers
/dev/nvidiaN in probe order, and the real capture's minors only shift; a permutation checks that each
minor is matched by bus id, not by position.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.facts.test_gpus import run_fact
from vllm_fleet.core import render
from vllm_fleet.core.cluster import resolve
from vllm_fleet.core.gpus import Gpu, parse_proc_minors, parse_smi_minors, parse_smi_table, with_minors
from vllm_fleet.core.plan import HostFacts, plan_host
from vllm_fleet.core.spec import SpecError, parse_host
from vllm_fleet.roles.nvidia_facts import NvidiaGpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"
A100_Q = "smi_q/a100-sxm4-80gb-x4-555.42.02-minors-3-to-6-FRAGMENT.txt"
A100_TABLE = "smi_table/a100-sxm4-80gb-x4-555.42.02-same-host-as-minors-3-to-6.txt"
PROC = "proc_gpus/gtx1080ti-titanx-x2-information.txt"
PERMUTATION = {"68": 5, "9E": 3, "C2": 6, "D4": 4}
M = {"name": "m", "host_path": "/opt/vllm/models/m"}
ENV = {"VLLM_API_KEY": "k"}


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def permuted() -> str:
    """The A100 fragment with its minors permuted (see the module docstring); nothing else changes."""
    out, gpu = [], None
    for line in text(A100_Q).splitlines(keepends=True):
        if line.startswith("GPU 00000000:"):
            gpu = line.split(":")[1]
        if line.startswith("    Minor Number") and gpu:
            line = line.split(":")[0] + f": {PERMUTATION[gpu]}\n"
        out.append(line)
    return "".join(out)


def a100s() -> list[Gpu]:
    """The 4 A100s as the table shows them (index, bus, name, memory), with the -q fragment's UUIDs."""
    uuids = {b: u for b, u in zip(("68", "9E", "C2", "D4"), _uuids(), strict=True)}
    return [Gpu(g.index, uuids[g.bus_id.split(":")[1]], g.name, g.memory_mib or 0, (8, 0), g.bus_id,
                "Disabled") for g in parse_smi_table(text(A100_TABLE)).gpus]


def _uuids() -> list[str]:
    return [ln.split(":", 1)[1].strip() for ln in text(A100_Q).splitlines() if ln.startswith("    GPU UUID")]


# --- parse ---------------------------------------------------------------------------------------------
def test_real_capture_minors_are_not_the_indexes() -> None:
    gpus = with_minors(a100s(), parse_smi_minors(text(A100_Q)))
    assert [(g.index, g.minor) for g in gpus] == [(0, 3), (1, 4), (2, 5), (3, 6)]


def test_minors_are_matched_by_bus_id_not_position() -> None:
    gpus = with_minors(a100s(), parse_smi_minors(permuted()))
    assert [(g.index, g.pci_bus_id, g.minor) for g in gpus] == [
        (0, "00000000:68:00.0", 5), (1, "00000000:9E:00.0", 3),
        (2, "00000000:C2:00.0", 6), (3, "00000000:D4:00.0", 4)]


def test_minors_by_uuid_when_the_bus_ids_are_spelled_otherwise() -> None:
    gpus = [Gpu(g.index, g.uuid, g.name, g.memory_mib, g.compute_capability, "") for g in a100s()]
    assert [g.minor for g in with_minors(gpus, parse_smi_minors(permuted()))] == [5, 3, 6, 4]


def test_proc_information_gives_the_minors() -> None:
    minors = parse_proc_minors(text(PROC))
    assert minors["0000:17:00"] == 0 and minors["0000:65:00"] == 1
    assert minors["GPU-4ce175fe-a313-4c4a-d620-560e96e8ef2e"] == 1


def test_nvidia_smi_q_wins_over_proc_and_an_unknown_gpu_keeps_none() -> None:
    gpus = a100s()
    proc = {"0000:68:00": 0, "0000:9e:00": 1}
    out = with_minors(gpus, parse_smi_minors(permuted()), proc)
    assert out[0].minor == 5
    assert with_minors(gpus[:2], {}, proc)[1].minor == 1
    assert with_minors(gpus[:1], {}, {})[0].minor is None


# --- the fact, through the fake nvidia-smi -------------------------------------------------------------
def _query_csv(tmp_path: Path) -> Path:
    """Derived --query-gpu CSV for the A100s (INDEX.md): table index/bus/memory/driver, -q UUID, cc 8.0."""
    rows = ["index, uuid, name, memory.total [MiB], compute_cap, pci.bus_id, mig.mode.current, "
            "driver_version"]
    rows += [f"{g.index}, {g.uuid}, {g.name}, {g.memory_mib} MiB, 8.0, {g.pci_bus_id}, Disabled, 555.42.02"
             for g in a100s()]
    path = tmp_path / "query.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture()
def fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(FIXTURES / "fake-nvidia-smi.sh", bin_dir / "nvidia-smi")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


def _fact(tmp_path: Path, fake_bin: Path, q: str | None, proc: Path | None = None,
          rdma: tuple[str, ...] = ()) -> dict[str, Any]:
    env = {"FAKE_SMI_CAPTURE": str(_query_csv(tmp_path))}
    if q is not None:
        (tmp_path / "q.txt").write_text(q)
        env["FAKE_SMI_Q_CAPTURE"] = str(tmp_path / "q.txt")
    fact = NvidiaGpus()
    fact.proc_gpus_dir = str(proc or tmp_path / "no-proc")
    fact.rdma_dir = str(tmp_path / "infiniband")
    if rdma:
        (tmp_path / "infiniband").mkdir()
        for name in rdma:
            (tmp_path / "infiniband" / name).touch()
    return run_fact(fact, env, fake_bin)


def test_fact_reads_minors_from_nvidia_smi_q(tmp_path: Path, fake_bin: Path) -> None:
    fact = _fact(tmp_path, fake_bin, permuted())
    assert [(g.index, g.minor) for g in fact["gpus"]] == [(0, 5), (1, 3), (2, 6), (3, 4)]
    assert fact["rdma_devices"] == () and fact["problem"] is None


def test_fact_falls_back_to_proc_information(tmp_path: Path, fake_bin: Path) -> None:
    """-q with no Minor Number lines (what a timed-out -q leaves): the driver's /proc files answer. The
    files are the real 2-GPU pair with their Bus Location and GPU UUID set to two of the A100s (derived)."""
    proc = tmp_path / "gpus"
    for gpu, minor in zip(a100s()[:2], (7, 2), strict=True):
        d = proc / gpu.pci_bus_id[4:].lower()
        d.mkdir(parents=True)
        (d / "information").write_text(f"GPU UUID:        {gpu.uuid}\nBus Location:    {gpu.pci_bus_id[4:]}\n"
                                       f"Device Minor:    {minor}\n")
    fact = _fact(tmp_path, fake_bin, "", proc)
    assert [g.minor for g in fact["gpus"]] == [7, 2, None, None]


def test_fact_lists_rdma_devices(tmp_path: Path, fake_bin: Path) -> None:
    fact = _fact(tmp_path, fake_bin, permuted(), rdma=("uverbs1", "rdma_cm", "uverbs0", "umad0", "bad name"))
    assert fact["rdma_devices"] == ("rdma_cm", "umad0", "uverbs0", "uverbs1")


# --- plan and render -----------------------------------------------------------------------------------
def fake_variant(version: str, accelerator: str, driver: Any, gpus: list, override: str | None) -> Any:
    return SimpleNamespace(variant="cu130", reason="fake", release_dir=f"{version}-cu130",
                           build=SimpleNamespace(index_url=None, extra_index_urls=(), index_strategy=None,
                                                 accelerator="cuda"))


def _plan(gpus: list[Gpu], data: dict | None = None, **facts: Any):
    spec = parse_host("gpu-a", data or {"model": M, "gpus": [1, 3]})
    return plan_host("gpu-a", spec, HostFacts(gpus=tuple(gpus), **facts), ENV, choose_variant=fake_variant)


def test_plan_carries_the_minors_and_the_unit_allows_them() -> None:
    p = _plan(with_minors(a100s(), parse_smi_minors(permuted())))
    inst = p.instances[0]
    assert (inst.gpu_indexes, inst.gpu_minors) == ((1, 3), (3, 4))
    unit = render.unit(p, inst)
    assert "DeviceAllow=/dev/nvidia3 rw\nDeviceAllow=/dev/nvidia4 rw\n" in unit
    assert "/dev/nvidia1 " not in unit and "infiniband" not in unit and "LimitMEMLOCK" not in unit


def test_a_gpu_without_a_minor_refuses_the_host_by_name() -> None:
    gpus = with_minors(a100s(), {"0000:9e:00": 4})  # GPU 1 known, GPU 3 not
    with pytest.raises(SpecError) as e:
        _plan(gpus)
    [line] = e.value.problems
    assert line.startswith("gpu-a: vllm.instances[default].gpus: the device minor number")
    assert "GPU 3 NVIDIA A100-SXM4-80GB" in line and "GPU 1 " not in line
    assert "nvidia-smi -q" in line and "Device Minor" in line


# --- RDMA on cluster nodes -----------------------------------------------------------------------------
RDMA = ("issm0", "rdma_cm", "umad0", "uverbs0", "uverbs1")


def _cluster(rdma: tuple[str, ...]):
    gpus = with_minors(a100s(), parse_smi_minors(permuted()))
    cluster = {"name": "big", "nodes": ["gpu1", "gpu2"]}
    nodes = {n: parse_host(n, {"model": M, "cluster": {**cluster, "address": a}})
             for n, a in (("gpu1", "10.0.0.1"), ("gpu2", "10.0.0.2"))}
    facts = HostFacts(gpus=tuple(gpus), interfaces={"10.0.0.2": "ib0"}, rdma_devices=rdma)
    return plan_host("gpu2", nodes["gpu2"], facts, ENV, choose_variant=fake_variant,
                     node=resolve(nodes, {})["gpu2"])


def test_cluster_node_with_rdma_allows_verbs_and_raises_memlock() -> None:
    p = _cluster(RDMA)
    inst = p.instances[0]
    assert inst.rdma_devices == ("rdma_cm", "uverbs0", "uverbs1")  # no subnet-management nodes
    unit = render.unit(p, inst)
    for dev in inst.rdma_devices:
        assert f"\nDeviceAllow=/dev/infiniband/{dev} rw\n" in unit
    assert "umad" not in unit and "issm" not in unit
    assert "\nLimitMEMLOCK=infinity\n" in unit
    assert "DeviceAllow=/dev/nvidia5 rw" in unit  # still the minors


def test_cluster_node_without_rdma_and_a_single_host_get_neither() -> None:
    p = _cluster(())
    assert p.instances[0].rdma_devices == ()
    assert "LimitMEMLOCK" not in render.unit(p, p.instances[0])
    single = _plan(with_minors(a100s(), parse_smi_minors(permuted())), rdma_devices=RDMA)
    assert single.instances[0].rdma_devices == ()
    assert "infiniband" not in render.unit(single, single.instances[0])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_rdma_cluster_unit_scores_well_in_systemd_analyze_security(tmp_path: Path) -> None:
    from tests.unit.test_unit_security import score

    p = _cluster(RDMA)
    unit = tmp_path / "vllm-rdma.service"
    unit.write_text(render.unit(p, p.instances[0]))
    value = score(unit)
    print(f"systemd-analyze security, RDMA cluster unit: {value}")
    assert value <= 2.0


def test_the_lab_tests_derived_csv_is_this_modules(tmp_path: Path) -> None:
    """tests/hosts/test_gpu_simulated.py replays the CSV written out in the fixtures: the same derivation,
    driver version included (without it the plan finds no driver and refuses before reading minors)."""
    written = FIXTURES / "query_csv/a100-sxm4-80gb-x4-555.42.02-DERIVED-from-table-and-q.txt"
    assert written.read_text() == _query_csv(tmp_path).read_text()
