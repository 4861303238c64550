"""vllm_fleet.core.gpus and vllm_fleet.roles.nvidia_facts on real captured nvidia-smi / kernel outputs.

Every GPU here is simulated by a real captured output under tests/fixtures/nvidia/ (sources in its
INDEX.md); each case names its capture. Expected values were read from the capture by eye and are
written literally; compute capabilities are NVIDIA's published values for the model.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.nvidia_captures import FIXTURES, capture
from vllm_fleet.core.gpus import (
    DRIVER_UNREACHABLE,
    MIG_ENABLED,
    NO_DEVICES,
    NO_DRIVER,
    NO_NVIDIA_SMI,
    OLD_NVIDIA_SMI,
    QUERY_FIELDS,
    QUERY_FIELDS_NO_CC,
    VERSION_MISMATCH,
    DriverVersion,
    Gpu,
    NvidiaOutputError,
    NvidiaProblem,
    UnknownGpuError,
    capability_from_name,
    classify_nvidia_error,
    mig_problem,
    missing_nvidia_smi,
    parse_compute_capability,
    parse_driver_version,
    parse_query_csv,
    parse_query_rows,
    parse_smi_list,
    parse_smi_query,
    parse_smi_table,
)
from vllm_fleet.roles.nvidia_facts import NvidiaDriver, NvidiaGpus

# --- nvidia-smi table: driver, CUDA, GPU rows ---------------------------------------------------------
H100 = "NVIDIA H100 80GB HBM3"
TABLES = [
    # the host whose -q shows Minor Numbers 3-6 for these indexes 0-3 (tests/unit/test_gpu_minors.py)
    (
        "smi_table/a100-sxm4-80gb-x4-555.42.02-same-host-as-minors-3-to-6.txt",
        "555.42.02",
        "12.5",
        [(i, "NVIDIA A100-SXM4-80GB", 81920, f"00000000:{b}:00.0")
         for i, b in enumerate(("68", "9E", "C2", "D4"))],
    ),
    (
        "smi_table/a100-pcie-40gb-x2-555.42.02-cuda12.5.txt",
        "555.42.02",
        "12.5",
        [
            (0, "NVIDIA A100-PCIE-40GB", 40960, "00000000:12:00.0"),
            (1, "NVIDIA A100-PCIE-40GB", 40960, "00000000:8A:00.0"),
        ],
    ),
    (
        "smi_table/a100-sxm4-40gb-x2plus-580.126.09-cuda13.0-TRUNC.txt",
        "580.126.09",
        "13.0",
        [
            (0, "NVIDIA A100-SXM4-40GB", 40960, "00000000:10:1C.0"),
            (1, "NVIDIA A100-SXM4-40GB", 40960, "00000000:10:1D.0"),
        ],
    ),
    (
        "smi_table/a10g-x1-470.256.02-cuda11.4-oldformat-TRUNC.txt",
        "470.256.02",
        "11.4",
        [(0, "NVIDIA A10G", 22731, "00000000:00:1E.0")],
    ),
    (
        "smi_table/a10g-x1-535.247.01-cuda12.2-TRUNC.txt",
        "535.247.01",
        "12.2",
        [(0, "NVIDIA A10G", 23028, "00000000:00:1E.0")],
    ),
    (
        "smi_table/a800-80gb-pcie-x2plus-550.54.15-cuda12.4-TRUNC.txt",
        "550.54.15",
        "12.4",
        [
            (0, "NVIDIA A800 80GB PCIe", 81920, "00000000:4F:00.0"),
            (1, "NVIDIA A800 80GB PCIe", 81920, "00000000:50:00.0"),
        ],
    ),
    (
        "smi_table/a800-sxm4-80gb-x2plus-535.86.10-cuda12.2-TRUNC.txt",
        "535.86.10",
        "12.2",
        [
            (0, "NVIDIA A800-SXM4-80GB", 81920, "00000000:27:00.0"),
            (1, "NVIDIA A800-SXM4-80GB", 81920, "00000000:2A:00.0"),
        ],
    ),
    (
        "smi_table/b200-x2plus-610.43.02-KMD-UMD-header-TRUNC.txt",
        "610.43.02",
        "13.3",
        [(0, "NVIDIA B200", 183359, "00000000:63:00.0"), (1, "NVIDIA B200", 183359, "00000000:68:00.0")],
    ),
    (
        "smi_table/b200-x8-580.95.05-cuda13.0-TRUNC.txt",
        "580.95.05",
        "13.0",
        [(0, "NVIDIA B200", 183359, "00000000:05:00.0"), (1, "NVIDIA B200", 183359, "00000000:06:00.0")],
    ),
    (
        "smi_table/gh200-480gb-x1-550.127.08-cuda12.4-gpu-section-only.txt",
        "550.127.08",
        "12.4",
        [(0, "NVIDIA GH200 480GB", 97871, "00000000:DD:00.0")],
    ),
    (
        "smi_table/gh200-480gb-x1-555.42.06-cuda12.5-domain0009-TRUNC.txt",
        "555.42.06",
        "12.5",
        [(0, "NVIDIA GH200 480GB", 97871, "00000009:01:00.0")],
    ),
    (
        "smi_table/gh200-480gb-x1-580.95.05-cuda13.0-openshift-TRUNC.txt",
        "580.95.05",
        "13.0",
        [(0, "NVIDIA GH200 480GB", 97871, "00000009:01:00.0")],
    ),
    (
        "smi_table/gtx1070-x1-396.24-no-cuda-version-TRUNC.txt",
        "396.24",
        None,
        [(0, "GeForce GTX 1070", 8114, "00000000:24:00.0")],
    ),
    (
        "smi_table/gtx680-x3plus-331.62-ancient-TRUNC.txt",
        "331.62",
        None,
        [
            (0, "GeForce GTX 680", 4095, "0000:03:00.0"),
            (1, "GeForce GTX 680", 4095, "0000:04:00.0"),
            (2, "GeForce GTX 680", 4095, "0000:83:00.0"),
        ],
    ),
    (
        "smi_table/h100-80gb-hbm3-x1-545.23.08-cuda12.3.txt",
        "545.23.08",
        "12.3",
        [(0, H100, 81559, "00000000:19:00.0")],
    ),
    (
        "smi_table/h100-80gb-hbm3-x1-580.105.08-cuda13.0.txt",
        "580.105.08",
        "13.0",
        [(0, H100, 81559, "00000000:B9:00.0")],
    ),
    (
        "smi_table/h100-80gb-hbm3-x2plus-535.129.03-cuda12.2-TRUNC.txt",
        "535.129.03",
        "12.2",
        [(0, H100, 81559, "00000000:04:00.0")],
    ),
    (
        "smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt",
        "560.35.05",
        "12.6",
        [
            (0, H100, 81559, "00000000:06:00.0"),
            (1, H100, 81559, "00000000:07:00.0"),
            (2, H100, 81559, "00000000:08:00.0"),
            (3, H100, 81559, "00000000:09:00.0"),
        ],
    ),
    (
        "smi_table/h200-x1plus-570.86.15-cuda12.8-TRUNC.txt",
        "570.86.15",
        "12.8",
        [(0, "NVIDIA H200", 143771, "00000000:19:00.0")],
    ),
    (
        "smi_table/l4-x1-570.133.20-cuda12.8-TRUNC.txt",
        "570.133.20",
        "12.8",
        [(0, "NVIDIA L4", 23034, "00000000:31:00.0")],
    ),
    (
        "smi_table/quadro-k3100m-x1-367.48-no-cuda-version-veryold.txt",
        "367.48",
        None,
        [(0, "Quadro K3100M", 4034, "0000:01:00.0")],
    ),
    # The capture stops after GPU 1's first line: its memory is unknown, not zero.
    (
        "smi_table/quadro-rtx4000-x2-535.129.03-cuda12.2-TRUNC.txt",
        "535.129.03",
        "12.2",
        [(0, "Quadro RTX 4000", 8192, "00000000:06:00.0"), (1, "Quadro RTX 4000", None, "00000000:07:00.0")],
    ),
    # NVIDIA-SMI 470.256.02 on Driver Version 580.95.05: the driver counts.
    (
        "smi_table/rtx-pro-laptop-x1-smi470.256.02-driver580.95.05-MISMATCHED-binary-in-snap-TRUNC.txt",
        "580.95.05",
        "13.0",
        [(0, "NVIDIA RTX PRO ...", 8151, "00000000:01:00.0")],
    ),
    (
        "smi_table/rtx3070-x1-470.57.02-cuda11.4-truncated-name-TRUNC.txt",
        "470.57.02",
        "11.4",
        [(0, "NVIDIA GeForce ...", 7979, "00000000:41:00.0")],
    ),
    (
        "smi_table/rtx3090-x4-595.84-cuda13.2-TRUNC.txt",
        "595.84",
        "13.2",
        [
            (0, "NVIDIA GeForce RTX 3090", 24576, "00000000:01:00.0"),
            (1, "NVIDIA GeForce RTX 3090", 24576, "00000000:21:00.0"),
        ],
    ),
    (
        "smi_table/rtx4070-x1-550.40.07-cuda12.4-TRUNC.txt",
        "550.40.07",
        "12.4",
        [(0, "NVIDIA GeForce RTX 4070", 12282, "00000000:2D:00.0")],
    ),
    (
        "smi_table/rtx4090-x2plus-550.163.01-cuda12.4-TRUNC.txt",
        "550.163.01",
        "12.4",
        [
            (0, "NVIDIA GeForce RTX 4090", 24564, "00000000:4E:00.0"),
            (1, "NVIDIA GeForce RTX 4090", 24564, "00000000:4F:00.0"),
        ],
    ),
    (
        "smi_table/rtx4090d-x1-550.107.02-cuda12.4-TRUNC.txt",
        "550.107.02",
        "12.4",
        [(0, "NVIDIA GeForce RTX 4090 D", 24564, "00000000:B8:00.0")],
    ),
    (
        "smi_table/rtx5070-x1-575.64.03-cuda-NA-freebsd-shim-TRUNC.txt",
        "575.64.03",
        None,
        [(0, "NVIDIA GeForce RTX 5070", 12227, "00000000:02:00.0")],
    ),
    (
        "smi_table/rtx5090-x1-595.71.05-cuda13.2-TRUNC.txt",
        "595.71.05",
        "13.2",
        [(0, "NVIDIA GeForce RTX 5090", 32607, "00000000:C5:00.0")],
    ),
    (
        "smi_table/rtx5090-x2-610.57.04-KMD-UMD-header-TRUNC.txt",
        "610.57.04",
        "13.3",
        [
            (0, "NVIDIA GeForce RTX 5090", 32607, "00000000:01:00.0"),
            (1, "NVIDIA GeForce RTX 5090", 32607, "00000000:02:00.0"),
        ],
    ),
    (
        "smi_table/rtx6000d-x2plus-590.44.01-cuda13.1-TRUNC.txt",
        "590.44.01",
        "13.1",
        [
            (0, "NVIDIA RTX 6000D", 85651, "00000000:13:00.0"),
            (1, "NVIDIA RTX 6000D", 85651, "00000000:14:00.0"),
        ],
    ),
    (
        "smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt",
        "550.135",
        "12.4",
        [(0, "Tesla P4", 8192, "00000000:86:00.0")],
    ),
    (
        "smi_table/titan-xp-x1-384.66-no-cuda-version-veryold-TRUNC.txt",
        "384.66",
        None,
        [(0, "TITAN Xp", 12174, "00000000:41:00.0")],
    ),
    (
        "smi_table/titan-xp-x1-450.57-cuda11.0-oldformat.txt",
        "450.57",
        "11.0",
        [(0, "TITAN Xp", 12196, "00000000:17:00.0")],
    ),
    (
        "smi_table/ue-nvidia-geforce-rtx-2080-super-595.71.05-idle.txt",
        "595.71.05",
        "13.2",
        [(0, "NVIDIA GeForce RTX 2080 ...", 8192, "00000000:0C:00.0")],
    ),
    (
        "smi_table/ue-nvidia-geforce-rtx-2080-super-610.57.04-idle.txt",
        "610.57.04",
        "13.3",
        [(0, "NVIDIA GeForce RTX 2080 ...", 8192, "00000000:0C:00.0")],
    ),
    (
        "smi_table/ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt",
        "595.71.05",
        "13.2",
        [(0, "NVIDIA GeForce RTX 4080 ...", 16376, "00000000:01:00.0")],
    ),
    (
        "smi_table/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt",
        "590.48.01",
        "13.1",
        [(0, H100, 81559, "00000000:00:09.0")],
    ),
    (
        "smi_table/ue-nvidia-h100-mig-590.48.01-idle.txt",
        "590.48.01",
        "13.1",
        [(0, H100, 81559, "00000000:00:09.0")],
    ),
    (
        "smi_table/ue-nvidia-h200-590.48.01-idle.txt",
        "590.48.01",
        "13.1",
        [(0, "NVIDIA H200", 143771, "00000000:83:00.0")],
    ),
    (
        "smi_table/ue-nvidia-h200-mig-590.48.01-idle.txt",
        "590.48.01",
        "13.1",
        [(0, "NVIDIA H200", 143771, "00000000:83:00.0")],
    ),
    (
        "smi_table/ue-nvidia-l40s-595.80-idle.txt",
        "595.80",
        "13.2",
        [(0, "NVIDIA L40S", 46068, "00000000:01:00.0")],
    ),
    (
        "smi_table/v100-sxm2-16gb-x1-470.182.03-cuda11.4-truncated-name-TRUNC.txt",
        "470.182.03",
        "11.4",
        [(0, "Tesla V100-SXM2...", 16160, "00000000:00:04.0")],
    ),
]


@pytest.mark.parametrize(("fixture", "driver", "cuda", "rows"), TABLES, ids=[t[0] for t in TABLES])
def test_smi_table_capture(fixture: str, driver: str, cuda: str | None, rows: list[tuple]) -> None:
    """The nvidia-smi table of a real host (capture named by the parameter) gives its driver and GPUs."""
    table = parse_smi_table(capture(fixture))
    assert str(table.driver) == driver
    assert table.cuda_version == cuda
    assert [(g.index, g.name, g.memory_mib, g.bus_id) for g in table.gpus] == rows


def test_every_table_capture_is_covered() -> None:
    """Fixture dir smi_table/: a capture added there without expectations fails here."""
    assert sorted(p.name for p in (FIXTURES / "smi_table").iterdir()) == sorted(
        Path(t[0]).name for t in TABLES
    )


@pytest.mark.parametrize(
    ("fixture", "mig"),
    [
        ("smi_table/ue-nvidia-h100-mig-590.48.01-idle.txt", ["Enabled"]),
        ("smi_table/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt", ["Disabled"]),
        ("smi_table/a100-pcie-40gb-x2-555.42.02-cuda12.5.txt", ["Disabled", "Disabled"]),
        ("smi_table/l4-x1-570.133.20-cuda12.8-TRUNC.txt", [None]),  # "N/A": no MIG on an L4
        ("smi_table/titan-xp-x1-384.66-no-cuda-version-veryold-TRUNC.txt", [None]),  # no MIG M. row at all
    ],
)
def test_smi_table_mig_column(fixture: str, mig: list[str | None]) -> None:
    """The MIG M. cell of each GPU row (real capture named by the parameter)."""
    assert [g.mig_mode for g in parse_smi_table(capture(fixture)).gpus] == mig


def test_table_row_cut_short_has_no_gpu() -> None:
    """smi_table/quadro-rtx4000-x2-535.129.03-cuda12.2-TRUNC.txt: GPU 1 has no memory line, so it cannot
    become a Gpu (a real capture cut by its source); GPU 0 can."""
    rows = parse_smi_table(capture("smi_table/quadro-rtx4000-x2-535.129.03-cuda12.2-TRUNC.txt")).gpus
    assert rows[0].to_gpu() == Gpu(0, "", "Quadro RTX 4000", 8192, (7, 5), "00000000:06:00.0")
    with pytest.raises(NvidiaOutputError, match="GPU 1"):
        rows[1].to_gpu()


def test_truncated_name_is_an_error_not_a_guess() -> None:
    """smi_table/rtx3070-x1-470.57.02-cuda11.4-truncated-name-TRUNC.txt shows "NVIDIA GeForce ...": any
    GeForce generation fits, so the compute capability must not be guessed."""
    row = parse_smi_table(capture("smi_table/rtx3070-x1-470.57.02-cuda11.4-truncated-name-TRUNC.txt")).gpus[0]
    with pytest.raises(UnknownGpuError, match=r"'NVIDIA GeForce \.\.\.'.*cut the name short"):
        row.to_gpu()


# --- compute capability from names ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "cc"),
    [
        # names exactly as real captures print them (tables, -L, -q, CSV)
        ("NVIDIA A100-PCIE-40GB", (8, 0)),
        ("NVIDIA A100-SXM4-80GB", (8, 0)),
        ("NVIDIA A10G", (8, 6)),
        ("NVIDIA A800 80GB PCIe", (8, 0)),
        ("NVIDIA A800-SXM4-80GB", (8, 0)),
        ("NVIDIA B200", (10, 0)),
        ("NVIDIA GH200 480GB", (9, 0)),
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA H200", (9, 0)),
        ("NVIDIA L4", (8, 9)),
        ("NVIDIA L40S", (8, 9)),
        ("Tesla V100-SXM2...", (7, 0)),
        ("Tesla P4", (6, 1)),
        ("TITAN Xp", (6, 1)),
        ("NVIDIA TITAN V", (7, 0)),
        ("Quadro RTX 4000", (7, 5)),
        ("Quadro K3100M", (3, 0)),
        ("NVIDIA RTX 5880 Ada Generation", (8, 9)),
        ("NVIDIA RTX PRO ...", (12, 0)),
        ("NVIDIA RTX 6000D", (12, 0)),
        ("GeForce GTX 680", (3, 0)),
        ("GeForce GTX 1070", (6, 1)),
        ("GeForce RTX 2080", (7, 5)),
        ("NVIDIA GeForce RTX 2080 SUPER", (7, 5)),
        ("NVIDIA GeForce RTX 2080 ...", (7, 5)),
        ("NVIDIA GeForce RTX 3090", (8, 6)),
        ("NVIDIA GeForce RTX 4070", (8, 9)),
        ("NVIDIA GeForce RTX 4080 SUPER", (8, 9)),
        ("NVIDIA GeForce RTX 4090 D", (8, 9)),
        ("NVIDIA GeForce RTX 5070", (12, 0)),
        ("NVIDIA GeForce RTX 5090", (12, 0)),
        # other models the fleet may meet (NVIDIA's CUDA GPU list)
        ("Tesla T4", (7, 5)),
        ("NVIDIA A30", (8, 0)),
        ("NVIDIA A40", (8, 6)),
        ("NVIDIA A10", (8, 6)),
        ("NVIDIA L40", (8, 9)),
        ("NVIDIA H100 PCIe", (9, 0)),
        ("NVIDIA H20", (9, 0)),
        ("Tesla P100-PCIE-16GB", (6, 0)),
        ("Tesla P40", (6, 1)),
        ("Tesla V100S-PCIE-32GB", (7, 0)),
        ("NVIDIA RTX A6000", (8, 6)),
        ("NVIDIA RTX A4000", (8, 6)),
        ("NVIDIA RTX 6000 Ada Generation", (8, 9)),
        ("NVIDIA RTX 4000 SFF Ada Generation", (8, 9)),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0)),
        ("Quadro RTX 8000", (7, 5)),
        ("NVIDIA TITAN RTX", (7, 5)),
        ("NVIDIA GeForce GTX 1080 Ti", (6, 1)),
        ("NVIDIA GeForce GTX 1660 SUPER", (7, 5)),
        ("NVIDIA GeForce RTX 3060 Laptop GPU", (8, 6)),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", (8, 9)),
        ("NVIDIA GB10", (12, 1)),
    ],
)
def test_capability_from_name(name: str, cc: tuple[int, int]) -> None:
    """Name table (used when nvidia-smi reports no compute_cap)."""
    assert capability_from_name(name) == cc


@pytest.mark.parametrize("name", ["NVIDIA GeForce ...", "NVIDIA RTX 6000", "Matrox G200eW", ""])
def test_unknown_names_resolve_to_nothing(name: str) -> None:
    assert capability_from_name(name) is None


# --- --query-gpu CSV ------------------------------------------------------------------------------------
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # the exporter project masks UUIDs with zeros


@pytest.mark.parametrize(
    ("fixture", "gpu"),
    [
        (
            "query_csv/ue-nvidia-geforce-rtx-2080-super-595.71.05-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA GeForce RTX 2080 SUPER", 8192, (7, 5), "00000000:0C:00.0", None),
        ),
        (
            "query_csv/ue-nvidia-geforce-rtx-2080-super-610.57.04-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA GeForce RTX 2080 SUPER", 8192, (7, 5), "00000000:0C:00.0", None),
        ),
        (
            "query_csv/ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA GeForce RTX 4080 SUPER", 16376, (8, 9), "00000000:01:00.0", None),
        ),
        (
            "query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA H100 80GB HBM3", 81559, (9, 0), "00000000:00:09.0", "Disabled"),
        ),
        (
            "query_csv/ue-nvidia-h100-mig-590.48.01-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA H100 80GB HBM3", 81559, (9, 0), "00000000:00:09.0", "Enabled"),
        ),
        (
            "query_csv/ue-nvidia-h200-mig-590.48.01-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA H200", 143771, (9, 0), "00000000:83:00.0", "Enabled"),
        ),
        (
            "query_csv/ue-nvidia-l40s-595.80-idle.txt",
            Gpu(0, ZERO_UUID, "NVIDIA L40S", 46068, (8, 9), "00000000:01:00.0", None),
        ),
    ],
)
def test_query_csv_with_header(fixture: str, gpu: Gpu) -> None:
    """A real --query-gpu capture with every field and a header (named by the parameter): the columns are
    found by name, units stripped, compute_cap read, [N/A] MIG mode becomes None."""
    assert parse_query_csv(capture(fixture), fields=None) == [gpu]


def test_query_csv_mig_problem() -> None:
    """query_csv/ue-nvidia-h100-mig-590.48.01-idle.txt: mig.mode.current is Enabled."""
    gpus = parse_query_csv(capture("query_csv/ue-nvidia-h100-mig-590.48.01-idle.txt"), fields=None)
    assert mig_problem(gpus) == NvidiaProblem(MIG_ENABLED, "on GPU 0")
    h100 = parse_query_csv(capture("query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt"), fields=None)
    assert mig_problem(h100) is None


def test_query_rows_of_a_partial_field_list() -> None:
    """query_csv/a100-pcie-40gb-x2-555.42.02-name-busid-vbios-mem-clocks-header-units.txt: a two-GPU host
    queried for name, bus id, memory... but not index or uuid: rows read, Gpus refused by name."""
    text = capture("query_csv/a100-pcie-40gb-x2-555.42.02-name-busid-vbios-mem-clocks-header-units.txt")
    rows = parse_query_rows(text)
    assert [(r["name"], r["pci.bus_id"], r["memory.total"]) for r in rows] == [
        ("NVIDIA A100-PCIE-40GB", "00000000:12:00.0", "40960 MiB"),
        ("NVIDIA A100-PCIE-40GB", "00000000:8A:00.0", "40960 MiB"),
    ]
    with pytest.raises(NvidiaOutputError, match="index, uuid"):
        parse_query_csv(text, fields=None)


@pytest.mark.parametrize(
    "fixture",
    [
        "query_csv/ada-sm89-x1-525.89.02-compute_cap-only.txt",
        "query_csv/ada-x1-570.133.07-compute_cap-only.txt",
    ],
)
def test_compute_cap_only_query(fixture: str) -> None:
    """`--query-gpu=compute_cap --format=csv` on an Ada host (real capture named by the parameter)."""
    (row,) = parse_query_rows(capture(fixture))
    assert parse_compute_capability(row["compute_cap"] or "") == (8, 9)


def test_query_row_from_an_old_driver() -> None:
    """query_csv/rtx2080-x1-440.64-power-mem-vbios-driver-name-uuid-noheader-nounits-FROM-PYREPR.txt: a
    noheader row from a 440 driver (long before compute_cap); its 6th and 7th values are driver and name."""
    cells = capture(
        "query_csv/rtx2080-x1-440.64-power-mem-vbios-driver-name-uuid-noheader-nounits-FROM-PYREPR.txt"
    )
    values = [c.strip() for c in cells.split(",")]
    assert str(parse_driver_version(values[5])) == "440.64"
    assert capability_from_name(values[6]) == (7, 5)


def test_query_error_text_is_not_data() -> None:
    """errors/nvml-mismatch-with-lib-version-550.144.txt read as query output: refused with the text."""
    with pytest.raises(NvidiaOutputError, match="Driver/library version mismatch"):
        parse_query_csv(capture("errors/nvml-mismatch-with-lib-version-550.144.txt"))


def test_no_compute_cap_query_needs_a_known_name() -> None:
    """An old nvidia-smi answers the no-compute_cap query; the name decides. Row values from
    smi_table/rtx3070-x1-470.57.02-cuda11.4-truncated-name-TRUNC.txt and
    smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt, laid out as QUERY_FIELDS_NO_CC."""
    p4 = parse_query_csv("0, GPU-x, Tesla P4, 8192, 00000000:86:00.0\n", QUERY_FIELDS_NO_CC)
    assert p4[0].compute_capability == (6, 1)
    with pytest.raises(UnknownGpuError):
        parse_query_csv("0, GPU-x, NVIDIA GeForce ..., 7979, 00000000:41:00.0\n", QUERY_FIELDS_NO_CC)


KNOWN_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA A10G", "Tesla T4", "NVIDIA GeForce RTX 4090", "NVIDIA L40S"]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(KNOWN_NAMES),
            st.integers(1, 400_000),
            st.sampled_from([(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]),
            st.integers(0, 0xFFFF),
            st.integers(0, 0xFF),
            st.uuids(),
        ),
        max_size=8,
    )
)
def test_query_csv_round_trip(rows: list) -> None:
    """What nvidia-smi prints for QUERY_FIELDS (', '-separated, nounits) parses back to the same GPUs."""
    gpus = [
        Gpu(i, f"GPU-{uuid}", name, mib, cc, f"{domain:08X}:{bus:02X}:00.0")
        for i, (name, mib, cc, domain, bus, uuid) in enumerate(rows)
    ]
    text = "".join(
        f"{g.index}, {g.uuid}, {g.name}, {g.memory_mib}, {'.'.join(map(str, g.compute_capability))}, "
        f"{g.pci_bus_id}\n"
        for g in gpus
    )
    assert parse_query_csv(text, QUERY_FIELDS) == gpus


# --- nvidia-smi -L ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "gpus"),
    [
        (
            "smi_L/a100-pcie-40gb-x2-555.42.02-list-gpus.txt",
            [
                (0, "NVIDIA A100-PCIE-40GB", "GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84", ()),
                (1, "NVIDIA A100-PCIE-40GB", "GPU-14ac2834-0d81-0508-69eb-e25264c08d21", ()),
            ],
        ),
        (
            "smi_L/a100-sxm4-80gb-x4-with-mig.txt",
            [
                (0, "NVIDIA A100-SXM4-80GB", "GPU-513536b6-7d19-9063-b049-1e69664bb298", ("1g.20gb",) * 4),
                (1, "NVIDIA A100-SXM4-80GB", "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95", ()),
                (2, "NVIDIA A100-SXM4-80GB", "GPU-5e375e7e-b41f-155b-dcdc-534524c356fc", ()),
                (3, "NVIDIA A100-SXM4-80GB", "GPU-69ec2344-ebac-b028-f88f-452abb3d7f11", ()),
            ],
        ),
        (
            "smi_L/quadro-rtx4000-x2-535.129.03.txt",
            [
                (0, "Quadro RTX 4000", "GPU-c7b57be0-94ff-d352-a59b-d0ee00aeed43", ()),
                (1, "Quadro RTX 4000", "GPU-d6de6afc-bdfe-75c4-5273-0544439153fc", ()),
            ],
        ),
        (
            "smi_L/titanv-rtx5880ada-x2-570.86.15.txt",
            [
                (0, "NVIDIA TITAN V", "GPU-b5169cef-2205-c30e-f2b3-220cfa14bafd", ()),
                (1, "NVIDIA RTX 5880 Ada Generation", "GPU-7518f6b0-991f-ce2b-3d37-c779130d3137", ()),
            ],
        ),
        (
            "smi_L/ue-nvidia-h100-mig-590.48.01-capabilities.txt",
            [(0, "NVIDIA H100 80GB HBM3", ZERO_UUID, ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))],
        ),
        (
            "smi_L/ue-nvidia-h200-mig-590.48.01-capabilities.txt",
            [(0, "NVIDIA H200", ZERO_UUID, ("1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"))],
        ),
        ("smi_L/ue-nvidia-l40s-595.80-capabilities.txt", [(0, "NVIDIA L40S", ZERO_UUID, ())]),
        (
            "smi_L/ue-nvidia-geforce-rtx-4080-super-595.71.05-capabilities.txt",
            [(0, "NVIDIA GeForce RTX 4080 SUPER", ZERO_UUID, ())],
        ),
    ],
)
def test_smi_list_capture(fixture: str, gpus: list[tuple]) -> None:
    """`nvidia-smi -L` of a real host (named by the parameter), MIG devices grouped under their GPU."""
    assert [tuple(g) for g in parse_smi_list(capture(fixture))] == gpus


# --- nvidia-smi -q ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "driver", "cuda", "gpu"),
    # minor: each capture's "Minor Number : 0"
    [
        (
            "smi_q/ue-nvidia-geforce-rtx-2080-super-595.71.05-idle.txt",
            "595.71.05",
            "13.2",
            Gpu(0, ZERO_UUID, "NVIDIA GeForce RTX 2080 SUPER", 8192, (7, 5), "00000000:0C:00.0", None, 0),
        ),
        # R610 prints "Driver Version : 610.57.04 [Deprecated...]" and "KMD Version : 610.57.04".
        (
            "smi_q/ue-nvidia-geforce-rtx-2080-super-610.57.04-idle.txt",
            "610.57.04",
            "13.3",
            Gpu(0, ZERO_UUID, "NVIDIA GeForce RTX 2080 SUPER", 8192, (7, 5), "00000000:0C:00.0", None, 0),
        ),
        (
            "smi_q/ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt",
            "595.71.05",
            "13.2",
            Gpu(0, ZERO_UUID, "NVIDIA GeForce RTX 4080 SUPER", 16376, (8, 9), "00000000:01:00.0", None, 0),
        ),
        (
            "smi_q/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt",
            "590.48.01",
            "13.1",
            Gpu(0, ZERO_UUID, "NVIDIA H100 80GB HBM3", 81559, (9, 0), "00000000:00:09.0", "Disabled", 0),
        ),
        # MIG devices list their own "Shared FB Memory Usage"; the GPU's total is 81559, not 40448.
        (
            "smi_q/ue-nvidia-h100-mig-590.48.01-idle.txt",
            "590.48.01",
            "13.1",
            Gpu(0, ZERO_UUID, "NVIDIA H100 80GB HBM3", 81559, (9, 0), "00000000:00:09.0", "Enabled", 0),
        ),
        (
            "smi_q/ue-nvidia-h200-590.48.01-idle.txt",
            "590.48.01",
            "13.1",
            Gpu(0, ZERO_UUID, "NVIDIA H200", 143771, (9, 0), "00000000:83:00.0", "Disabled", 0),
        ),
        (
            "smi_q/ue-nvidia-h200-mig-590.48.01-idle.txt",
            "590.48.01",
            "13.1",
            Gpu(0, ZERO_UUID, "NVIDIA H200", 143771, (9, 0), "00000000:83:00.0", "Enabled", 0),
        ),
        (
            "smi_q/ue-nvidia-l40s-595.80-idle.txt",
            "595.80",
            "13.2",
            Gpu(0, ZERO_UUID, "NVIDIA L40S", 46068, (8, 9), "00000000:01:00.0", None, 0),
        ),
    ],
)
def test_smi_query_capture(fixture: str, driver: str, cuda: str, gpu: Gpu) -> None:
    """`nvidia-smi -q` of a real host (named by the parameter)."""
    report = parse_smi_query(capture(fixture))
    assert (str(report.driver), report.cuda_version, report.gpus) == (driver, cuda, [gpu])


# --- driver version ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "text", "l4t"),
    [
        ("proc_version/x86_64-proprietary-384.98.txt", "384.98", False),
        ("proc_version/x86_64-proprietary-515.76-ubuntu18.04-DEPREFIXED.txt", "515.76", False),
        ("proc_version/x86_64-open-525.60.11-arch.txt", "525.60.11", False),
        ("proc_version/x86_64-open-555.58-gentoo-nvrm-line-only.txt", "555.58", False),
        # Jetson: the L4T release, kept apart from driver branches.
        ("proc_version/aarch64-open-jetson-35.3.1.txt", "35.3.1", True),
        ("smi_version/ue-nvidia-geforce-rtx-2080-super-595.71.05-capabilities.txt", "595.71.05", False),
        # R610 --version: "DRIVER version : Deprecated, see KMD version", then "KMD version : 610.57.04".
        ("smi_version/ue-nvidia-geforce-rtx-2080-super-610.57.04-capabilities.txt", "610.57.04", False),
        ("smi_version/ue-nvidia-h100-80gb-hbm3-590.48.01-capabilities.txt", "590.48.01", False),
        ("smi_version/ue-nvidia-l40s-595.80-capabilities.txt", "595.80", False),
        ("smi_table/titan-xp-x1-450.57-cuda11.0-oldformat.txt", "450.57", False),
        ("smi_table/b200-x2plus-610.43.02-KMD-UMD-header-TRUNC.txt", "610.43.02", False),
        (
            "smi_table/rtx-pro-laptop-x1-smi470.256.02-driver580.95.05-MISMATCHED-binary-in-snap-TRUNC.txt",
            "580.95.05",
            False,
        ),
        ("smi_q/ue-nvidia-geforce-rtx-2080-super-610.57.04-idle.txt", "610.57.04", False),
        # modinfo of a module that does not load (the capture's last line)
        (
            "errors/nvidia-smi-failed-couldnt-communicate-aws-g5-450.142.00-with-modinfo.txt",
            "450.142.00",
            False,
        ),
        # the driver_version column of a full --query-gpu capture
        ("query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt#driver_version", "590.48.01", False),
    ],
)
def test_driver_version_capture(fixture: str, text: str, l4t: bool) -> None:
    """Driver version from a real capture (named by the parameter) in each form it comes in."""
    path, _, column = fixture.partition("#")
    source = capture(path)
    if column:
        source = parse_query_rows(source)[0][column] or ""
    version = parse_driver_version(source)
    assert (version.text, version.l4t) == (text, l4t)
    assert str(version) == (f"L4T {text}" if l4t else text)


def test_driver_version_csv_noheader_lines() -> None:
    """`--query-gpu=driver_version --format=csv,noheader` prints one line per GPU (the 2-GPU A800 host of
    smi_table/a800-80gb-pcie-x2plus-550.54.15-cuda12.4-TRUNC.txt would print its driver twice)."""
    assert str(parse_driver_version("550.54.15\n550.54.15\n")) == "550.54.15"
    assert str(parse_driver_version("driver_version\n550.54.15\n")) == "550.54.15"


@pytest.mark.parametrize(
    "fixture",
    ["errors/nvml-mismatch-with-lib-version-550.144.txt", "query_csv/ada-x1-570.133.07-compute_cap-only.txt"],
)
def test_no_driver_version_in(fixture: str) -> None:
    """Neither the NVML library version of a mismatch nor a compute capability passes for a driver."""
    with pytest.raises(NvidiaOutputError):
        parse_driver_version(capture(fixture))


def test_driver_versions_order_numerically() -> None:
    """Drivers from the captures, lowest to highest (550.135 is newer than 550.54.15)."""
    texts = [
        "331.62",
        "367.48",
        "384.66",
        "396.24",
        "450.57",
        "470.182.03",
        "525.60.11",
        "550.54.15",
        "550.135",
        "580.65.06",
        "590.48.01",
        "610.57.04",
    ]
    versions = [DriverVersion.parse(t) for t in reversed(texts)]
    assert [v.text for v in sorted(versions)] == texts


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 999), min_size=2, max_size=3),
    st.lists(st.integers(0, 999), min_size=2, max_size=3),
)
def test_driver_version_order_is_numeric(a: list[int], b: list[int]) -> None:
    va, vb = (DriverVersion.parse(".".join(f"{p:02d}" for p in x)) for x in (a, b))
    assert (va < vb) == (tuple(a) < tuple(b))
    assert str(va) == ".".join(f"{p:02d}" for p in a)  # the printed form survives


# --- errors -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "kind", "detail", "says"),
    [
        (
            "errors/nvidia-smi-command-not-found.txt",
            NO_DRIVER,
            "",
            ["Install the NVIDIA driver", "accelerator: cpu"],
        ),
        (
            "errors/nvidia-smi-failed-couldnt-communicate.txt",
            DRIVER_UNREACHABLE,
            "",
            ["kernel driver", "reboot"],
        ),
        (
            "errors/nvidia-smi-failed-couldnt-communicate-aws-g5-450.142.00-with-modinfo.txt",
            DRIVER_UNREACHABLE,
            "kernel module on disk: 450.142.00",
            ["lsmod", "450.142.00"],
        ),
        (
            "errors/nvml-mismatch-no-lib-version-line-460.txt",
            VERSION_MISMATCH,
            "",
            ["Reboot the host", "reload the nvidia kernel module"],
        ),
        (
            "errors/nvml-mismatch-with-lib-version-550.144.txt",
            VERSION_MISMATCH,
            "NVML library 550.144",
            ["Reboot the host", "reload the nvidia kernel module", "550.144"],
        ),
        ("errors/no-devices-were-found-rtx5090.txt", NO_DEVICES, "", ["no GPU", "lspci"]),
        (
            "errors/field-compute_cap-not-valid-old-smi.txt",
            OLD_NVIDIA_SMI,
            "it rejects the query field compute_cap",
            ["compute capability was taken from the GPU name"],
        ),
        (
            "smi_table/rtx-pro-laptop-x1-smi470.256.02-driver580.95.05-MISMATCHED-binary-in-snap-TRUNC.txt",
            OLD_NVIDIA_SMI,
            "NVIDIA-SMI 470.256.02 on driver 580.95.05",
            ["ships with the installed driver"],
        ),
        ("smi_L/a100-sxm4-80gb-x4-with-mig.txt", MIG_ENABLED, "on GPU 0", ["-mig 0"]),
        ("smi_L/ue-nvidia-h200-mig-590.48.01-capabilities.txt", MIG_ENABLED, "on GPU 0", ["-mig 0"]),
        ("smi_table/ue-nvidia-h100-mig-590.48.01-idle.txt", MIG_ENABLED, "on GPU 0", ["MIG mode is enabled"]),
        ("smi_q/ue-nvidia-h200-mig-590.48.01-idle.txt", MIG_ENABLED, "on GPU 0", ["MIG mode is enabled"]),
        ("query_csv/ue-nvidia-h100-mig-590.48.01-idle.txt", MIG_ENABLED, "on GPU 0", ["MIG mode is enabled"]),
    ],
)
def test_classify_capture(fixture: str, kind: str, detail: str, says: list[str]) -> None:
    """Each error kind, from a real capture (named by the parameter), with a message naming the host."""
    problem = classify_nvidia_error(capture(fixture))
    assert problem == NvidiaProblem(kind, detail)
    message = problem.message("gpu-node-7")
    assert message.startswith("gpu-node-7: ")
    for words in says:
        assert words in message


@pytest.mark.parametrize(
    "fixture",
    [
        "smi_table/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt",
        "smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt",
        "smi_L/ue-nvidia-h200-590.48.01-capabilities.txt",
        "smi_q/ue-nvidia-h200-590.48.01-idle.txt",
        "query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt",
        "proc_version/x86_64-open-525.60.11-arch.txt",
        "smi_version/ue-nvidia-h200-590.48.01-capabilities.txt",
    ],
)
def test_healthy_captures_are_no_problem(fixture: str) -> None:
    """A healthy host's output (real capture named by the parameter) is data, not an error."""
    assert classify_nvidia_error(capture(fixture)) is None


def test_only_the_worked_around_problem_is_not_blocking() -> None:
    assert not NvidiaProblem(OLD_NVIDIA_SMI).blocking
    assert all(
        NvidiaProblem(k).blocking for k in (NO_DRIVER, DRIVER_UNREACHABLE, VERSION_MISMATCH, NO_DEVICES)
    )


# --- the pyinfra facts, run in a shell against a simulated nvidia-smi -------------------------------------
# The fake nvidia-smi answers --query-gpu from a real full-field capture (header with units) by column
# name, or prints a real error capture, so the fact's shell and process() see what a host would print.
FAKE_SMI = (FIXTURES / "fake-nvidia-smi.sh").read_text()


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return tmp_path


def run_fact(
    fact, env: dict[str, str], bin_dir: Path | None, proc: str = "/nonexistent", modinfo: str = "false"
):
    fact.proc_version_path, fact.modinfo_command = proc, modinfo
    path = f"{bin_dir}:/usr/bin:/bin" if bin_dir else "/usr/bin:/bin"
    out = subprocess.run(
        ["sh", "-c", fact.command()],
        env={"PATH": path, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return fact.process(out.stdout.splitlines())


def test_fact_reads_gpus_and_driver(fake_bin: Path) -> None:
    """NvidiaGpus on a host simulated by query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt."""
    env = {"FAKE_SMI_CAPTURE": str(FIXTURES / "query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt")}
    fact = run_fact(NvidiaGpus(), env, fake_bin)
    assert fact["gpus"] == [Gpu(0, ZERO_UUID, H100, 81559, (9, 0), "00000000:00:09.0", "Disabled")]
    assert (str(fact["driver"]), fact["driver_source"]) == ("590.48.01", "nvidia-smi")
    assert fact["fields"] == "index,uuid,name,memory.total,compute_cap,pci.bus_id,mig.mode.current"
    assert (fact["problem"], fact["notice"]) == (None, None)


def test_fact_falls_back_for_an_old_nvidia_smi(fake_bin: Path) -> None:
    """An nvidia-smi that rejects compute_cap with errors/field-compute_cap-not-valid-old-smi.txt, on the
    H200 of query_csv/ue-nvidia-h200-mig-590.48.01-idle.txt: the name gives 9.0, MIG is still seen."""
    env = {
        "FAKE_SMI_CAPTURE": str(FIXTURES / "query_csv/ue-nvidia-h200-mig-590.48.01-idle.txt"),
        "FAKE_SMI_REJECT_COMPUTE_CAP": str(FIXTURES / "errors/field-compute_cap-not-valid-old-smi.txt"),
    }
    fact = run_fact(NvidiaGpus(), env, fake_bin)
    assert fact["fields"] == "index,uuid,name,memory.total,pci.bus_id,mig.mode.current"
    assert fact["gpus"] == [Gpu(0, ZERO_UUID, "NVIDIA H200", 143771, (9, 0), "00000000:83:00.0", "Enabled")]
    assert fact["problem"] == NvidiaProblem(MIG_ENABLED, "on GPU 0")
    assert fact["notice"] == NvidiaProblem(OLD_NVIDIA_SMI, "it rejects the query field compute_cap")


def test_fact_old_nvidia_smi_without_mig(fake_bin: Path) -> None:
    """As above on query_csv/ue-nvidia-l40s-595.80-idle.txt (no MIG): the old nvidia-smi is the note left."""
    env = {
        "FAKE_SMI_CAPTURE": str(FIXTURES / "query_csv/ue-nvidia-l40s-595.80-idle.txt"),
        "FAKE_SMI_REJECT_COMPUTE_CAP": str(FIXTURES / "errors/field-compute_cap-not-valid-old-smi.txt"),
    }
    fact = run_fact(NvidiaGpus(), env, fake_bin)
    assert [g.compute_capability for g in fact["gpus"]] == [(8, 9)]
    assert fact["problem"] is None  # nothing stops the GPUs being used
    assert fact["notice"] == NvidiaProblem(OLD_NVIDIA_SMI, "it rejects the query field compute_cap")


@pytest.mark.parametrize(
    ("error", "rc", "proc", "kind", "driver"),
    [
        # mismatch: nvidia-smi fails, the loaded (old) module answers in /proc
        (
            "errors/nvml-mismatch-with-lib-version-550.144.txt",
            "18",
            "proc_version/x86_64-open-525.60.11-arch.txt",
            VERSION_MISMATCH,
            ("525.60.11", "proc"),
        ),
        (
            "errors/no-devices-were-found-rtx5090.txt",
            "6",
            None,
            NO_DEVICES,
            (None, None),
        ),
        (
            "errors/nvidia-smi-failed-couldnt-communicate.txt",
            "9",
            None,
            DRIVER_UNREACHABLE,
            (None, None),
        ),
    ],
)
def test_fact_reports_errors_without_failing(
    fake_bin: Path, error: str, rc: str, proc: str | None, kind: str, driver: tuple
) -> None:
    """nvidia-smi printing a real error capture (named by the parameter) and exiting non-zero."""
    env = {"FAKE_SMI_ERROR": str(FIXTURES / error), "FAKE_SMI_RC": rc}
    fact = run_fact(NvidiaGpus(), env, fake_bin, proc=str(FIXTURES / proc) if proc else "/nonexistent")
    assert fact["gpus"] == []
    assert fact["problem"] == classify_nvidia_error(capture(error))
    assert fact["problem"].kind == kind
    assert (fact["driver"] and fact["driver"].text, fact["driver_source"]) == driver


def test_fact_without_nvidia_smi_or_driver_is_no_driver(tmp_path: Path) -> None:
    """No nvidia-smi on PATH, no /proc/driver/nvidia/version, no module on disk: no driver at all."""
    fact = run_fact(NvidiaGpus(), {}, None)
    assert (fact["problem"], fact["driver"], fact["driver_source"]) == (NvidiaProblem(NO_DRIVER), None, None)
    assert fact["problem"].message("gpu-3").startswith(
        "gpu-3: nvidia-smi is not installed and no NVIDIA driver is loaded. Install the NVIDIA driver")


def test_fact_loaded_driver_without_nvidia_smi_says_so() -> None:
    """No nvidia-smi on PATH while /proc shows a loaded driver, here the open kernel module of
    proc_version/x86_64-open-525.60.11-arch.txt: the tools are missing, not the driver."""
    proc = str(FIXTURES / "proc_version/x86_64-open-525.60.11-arch.txt")
    fact = run_fact(NvidiaGpus(), {}, None, proc=proc)
    assert (str(fact["driver"]), fact["driver_source"]) == ("525.60.11", "proc")
    assert fact["problem"] == NvidiaProblem(NO_NVIDIA_SMI, "525.60.11")
    assert fact["problem"].blocking and fact["gpus"] == []
    assert fact["problem"].message("gpu-3") == (
        "gpu-3: the NVIDIA driver 525.60.11 is loaded (/proc/driver/nvidia/version) but nvidia-smi is not "
        "installed/not on PATH: install the driver's utilities package (nvidia-utils-525 on Ubuntu, "
        "nvidia-smi on Debian) for the loaded driver's version (nvidia-utils-525-server with Ubuntu's server "
        "driver), or put the directory that holds nvidia-smi on the PATH of the deploy login's "
        "non-interactive shell; fleet reads the GPUs through it."
    )


@pytest.mark.parametrize(
    ("fixture", "version", "branch"),
    [
        ("proc_version/x86_64-proprietary-384.98.txt", "384.98", "384"),
        ("proc_version/x86_64-open-555.58-gentoo-nvrm-line-only.txt", "555.58", "555"),
        ("proc_version/x86_64-proprietary-515.76-ubuntu18.04-DEPREFIXED.txt", "515.76", "515"),
    ],
)
def test_fact_names_the_utils_package_of_the_loaded_branch(fixture: str, version: str, branch: str) -> None:
    """As above for each x86_64 /proc capture (named by the parameter): the package follows its branch."""
    fact = run_fact(NvidiaGpus(), {}, None, proc=str(FIXTURES / fixture))
    assert fact["problem"] == NvidiaProblem(NO_NVIDIA_SMI, version)
    assert f"the NVIDIA driver {version} is loaded" in fact["problem"].message("h")
    assert f"(nvidia-utils-{branch} on Ubuntu, nvidia-smi on Debian)" in fact["problem"].message("h")


def test_fact_jetson_without_nvidia_smi() -> None:
    """No nvidia-smi on the Jetson of proc_version/aarch64-open-jetson-35.3.1.txt: its L4T driver is loaded;
    the message names it and says vLLM's wheels are not for Jetson, not which Ubuntu package to add."""
    jetson = str(FIXTURES / "proc_version/aarch64-open-jetson-35.3.1.txt")
    fact = run_fact(NvidiaGpus(), {}, None, proc=jetson)
    assert fact["problem"] == NvidiaProblem(NO_NVIDIA_SMI, "L4T 35.3.1")
    message = fact["problem"].message("orin")
    assert message.startswith("orin: the NVIDIA driver L4T 35.3.1 is loaded (/proc/driver/nvidia/version) "
                              "but nvidia-smi is not installed/not on PATH: this is a Jetson (L4T)")
    assert "nvidia-utils" not in message
    assert run_fact(NvidiaDriver(), {}, None, proc=jetson) == DriverVersion((35, 3, 1), "35.3.1", l4t=True)
    assert str(run_fact(NvidiaDriver(), {}, None, proc=jetson)) == "L4T 35.3.1"


def test_fact_module_on_disk_without_nvidia_smi(tmp_path: Path) -> None:
    """No nvidia-smi and no /proc file, but `modinfo nvidia` finds the module (its line from errors/nvidia-
    smi-failed-couldnt-communicate-aws-g5-450.142.00-with-modinfo.txt): installed, not loaded."""
    aws = FIXTURES / "errors/nvidia-smi-failed-couldnt-communicate-aws-g5-450.142.00-with-modinfo.txt"
    modinfo = tmp_path / "modinfo"
    modinfo.write_text(f"#!/bin/sh\ntail -n 1 '{aws}'\n")
    modinfo.chmod(0o755)
    fact = run_fact(NvidiaGpus(), {}, None, modinfo=str(modinfo))
    on_disk = "kernel module 450.142.00 is on disk (modinfo) but not loaded"
    assert fact["problem"] == NvidiaProblem(NO_DRIVER, on_disk)
    assert "(kernel module 450.142.00 is on disk (modinfo) but not loaded)" in fact["problem"].message("g5")


def test_missing_nvidia_smi_rule() -> None:
    v = DriverVersion.parse("550.54.15")
    assert missing_nvidia_smi(v, "proc") == NvidiaProblem(NO_NVIDIA_SMI, "550.54.15")
    assert missing_nvidia_smi(None, None) == NvidiaProblem(NO_DRIVER)
    assert missing_nvidia_smi(v, "modinfo").kind == NO_DRIVER


def test_fact_commands_only_read() -> None:
    """The facts are read-only: their shell runs nvidia-smi queries, cat and modinfo, nothing that writes."""
    for fact in (NvidiaGpus(), NvidiaDriver()):
        command = fact.command()
        for verb in ("modprobe", "rmmod", "apt", "install ", " -pm", "-mig", " > /", ">>", "tee ", "rm "):
            assert verb not in command, (type(fact).__name__, verb)


def test_driver_fact_from_modinfo(tmp_path: Path, fake_bin: Path) -> None:
    """A module that does not load (errors/nvidia-smi-failed-couldnt-communicate-aws-g5-450.142.00-with-
    modinfo.txt): no /proc file, so the version comes from `modinfo nvidia`, here its captured line."""
    aws = FIXTURES / "errors/nvidia-smi-failed-couldnt-communicate-aws-g5-450.142.00-with-modinfo.txt"
    modinfo = tmp_path / "modinfo"
    modinfo.write_text(f"#!/bin/sh\ntail -n 1 '{aws}'\n")
    modinfo.chmod(0o755)
    env = {
        "FAKE_SMI_ERROR": str(FIXTURES / "errors/nvidia-smi-failed-couldnt-communicate.txt"),
        "FAKE_SMI_RC": "9",
    }
    fact = run_fact(NvidiaGpus(), env, fake_bin, modinfo=str(modinfo))
    assert (str(fact["driver"]), fact["driver_source"]) == ("450.142.00", "modinfo")
    assert fact["problem"] == NvidiaProblem(DRIVER_UNREACHABLE)
    assert str(run_fact(NvidiaDriver(), env, fake_bin, modinfo=str(modinfo))) == "450.142.00"


def test_fact_defaults_and_style() -> None:
    """pyinfra style: a docstring with sample output; no requires_command (a host without nvidia-smi must
    be reported, not skipped); values print as JSON through to_json, as pyinfra's CLI encoder expects."""
    for cls in (NvidiaGpus, NvidiaDriver):
        assert ".. code:: python" in (cls.__doc__ or "")
        assert cls().requires_command() is None
    assert NvidiaGpus.default() is not NvidiaGpus.default()
    assert NvidiaDriver.default() is None
    assert os.path.basename(NvidiaDriver.proc_version_path) == "version"
    gpu = Gpu(0, ZERO_UUID, H100, 81559, (9, 0), "00000000:00:09.0", "Disabled")
    problem = NvidiaProblem(OLD_NVIDIA_SMI, "x")
    assert json.loads(
        json.dumps([gpu, DriverVersion.parse("580.65.06"), problem], default=lambda o: o.to_json())
    ) == [
        {
            "index": 0,
            "uuid": ZERO_UUID,
            "name": H100,
            "memory_mib": 81559,
            "compute_capability": [9, 0],
            "pci_bus_id": "00000000:00:09.0",
            "mig_mode": "Disabled",
            "minor": None,
        },
        "580.65.06",
        {"kind": "old_nvidia_smi", "detail": "x", "blocking": False},
    ]
