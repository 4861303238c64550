"""GPU health preflight (vllm_fleet/core/gpuhealth.py): nvidia-smi -q and kernel Xid lines -> refusals and
warnings,
and the plan refusing a new instance on a GPU with errors.

Every capture is real (tests/fixtures/nvidia, INDEX.md says who captured it where); fragments are kept
as their sources printed them. Where a test puts two captures on one host (a GPU's -q report and an Xid
line from another machine with the same PCI address) it says so; no value is edited. No GPU here.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.nvidia_captures import FIXTURES, capture
from vllm_fleet.core.gpuhealth import HealthReport, parse_smi_health, parse_xids, verdict
from vllm_fleet.core.gpus import Gpu, parse_smi_query, pci_key
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.spec import SpecError, parse_host
from vllm_fleet.roles.nvidia_facts import MARK, NvidiaGpus

HOST = "gpu-31"
ENV = {"VLLM_API_KEY": "k"}
M = {"name": "q", "path": "/srv/q"}
IDLE = sorted(p.name for p in (FIXTURES / "smi_q").glob("ue-*-idle.txt"))
A100 = "smi_q/a100-sxm4-80gb-x8-510.73.08-remap-pending-FRAGMENT.txt"
A100_XID = "xid/a100-xid-63-row-remapper-syslog.txt"
H100 = "smi_q/h100-x8-550.90.07-ecc-rowremapper-remap-pending-FRAGMENT.txt"
H100_XID = "xid/h100-550.90.07-xid-48-63-94-dmesg.txt"
GH200 = "smi_q/gh200-480gb-x1-550.127.05-aggregate-dram-uncorrectable-1-row-remapped.txt"
SRAM = "smi_q/sram-uncorrectable-volatile-1-aggregate-5-ECC-section-FRAGMENT.txt"
V100 = "smi_q/v100-sxm2-32gb-c4130-hw-power-brake-clocks-FRAGMENT.txt"
XID79 = "xid/xid-79-fallen-off-the-bus-journalctl.txt"
L40S = "smi_q/ue-nvidia-l40s-595.80-idle.txt"
H100_IDLE = "smi_q/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt"


def gpu_of(bus: str, name: str, index: int = 0, cc: tuple[int, int] = (8, 0)) -> Gpu:
    """A GPU named as a fragment shows it; fragments print no UUID or memory, so those are '' and 0."""
    return Gpu(index, "", name, 0, cc, bus, minor=index)


def fake_variant(version: str, accelerator: str, driver: Any, gpu_list: list, override: str | None):
    return SimpleNamespace(variant="cu130", reason="fake", release_dir=f"{version}-cu130",
                           build=SimpleNamespace(index_url=None, extra_index_urls=(), index_strategy=None,
                                                 accelerator="cuda"))


def plan(data: dict, facts: HostFacts) -> HostPlan:
    return plan_host(HOST, parse_host(HOST, {"accelerator": "cuda", **data}), facts, ENV,
                     choose_variant=fake_variant)


def refused(data: dict, facts: HostFacts) -> list[str]:
    with pytest.raises(SpecError) as e:
        plan(data, facts)
    return e.value.problems


# --- PCI ids ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("smi", "kernel"), [("00000000:3B:00.0", "0000:3b:00"),
                                             ("00000000:10:1C.0", "PCI:0000:10:1c"),
                                             ("00000001:00:00.0", "0001:00:00")])
def test_nvidia_smi_and_kernel_spellings_of_one_address_match(smi: str, kernel: str) -> None:
    assert pci_key(smi) == pci_key(kernel) is not None


def test_a_different_function_or_bus_is_another_gpu() -> None:
    assert pci_key("00000000:3B:00.0") != pci_key("0000:3c:00")
    assert pci_key("not a bus id") is None


# --- idle captures ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", IDLE)
def test_idle_captures_give_no_refusal(name: str) -> None:
    """Captured on real hardware by the nvidia_gpu_exporter collector (utkuozdemir), no GPU here: idle
    GPUs are never refused; the only warning they may give is persistence mode off."""
    text = capture(f"smi_q/{name}")
    report = HealthReport.parse(text, "")
    for gpu in parse_smi_query(text).gpus:
        v = report.verdict(gpu)
        assert v.refusals == ()
        assert all("persistence mode is off" in w for w in v.warnings), v.warnings


def test_persistence_off_warns_with_the_command() -> None:
    """Captured on real hardware (L40S, nvidia_gpu_exporter), no GPU here: Persistence Mode Disabled."""
    text = capture(L40S)
    gpu = parse_smi_query(text).gpus[0]
    (w,) = HealthReport.parse(text, "").verdict(gpu).warnings
    assert w.startswith("GPU 0 NVIDIA L40S (compute capability 8.9) (PCI 00000000:01:00.0): persistence")
    assert "`nvidia-smi -pm 1 -i 0`" in w and "nvidia-persistenced" in w


def test_ecc_na_on_geforce_is_unknown_not_zero() -> None:
    """Captured on real hardware (RTX 4080 SUPER, nvidia_gpu_exporter), no GPU here: no ECC on GeForce."""
    (h,) = parse_smi_health(capture("smi_q/ue-nvidia-geforce-rtx-4080-super-595.71.05-idle.txt"))
    assert (h.ecc_volatile_uncorrectable, h.remap_pending, h.minor, h.persistence) == (None, None, 0, False)


# --- error captures ---------------------------------------------------------------------------------------
ERRORS = [
    # (capture, xid capture, gpu, refusal substrings, warning substrings)
    (A100, A100_XID, gpu_of("00000000:10:1C.0", "NVIDIA A100-SXM4-80GB"),
     ["a row remap is pending", "`nvidia-smi -r -i 0`"], ["Xid 63 (row remap / page retirement pending)"]),
    (H100, H100_XID, gpu_of("00000000:52:00.0", "NVIDIA H100 80GB HBM3", cc=(9, 0)),
     ["a row remap is pending"], ["Xid 48 (double-bit ECC error); Xid 63", "Xid 94 (pid="]),
    (GH200, None, gpu_of("00000000:DD:00.0", "NVIDIA GH200 480GB", cc=(9, 0)),
     [], ["1 uncorrectable ECC error(s) in its lifetime (aggregate)"]),
    (SRAM, None, gpu_of("00000000:3B:00.0", "NVIDIA A100-SXM4-80GB"),
     ["1 uncorrectable ECC error(s) since the driver loaded (volatile)"], []),
    (V100, None, gpu_of("00000000:3B:00.0", "Tesla V100-SXM2-32GB", cc=(7, 0)),
     [], ["clocks slowed by HW Slowdown, HW Power Brake Slowdown"]),
]


@pytest.mark.parametrize(("smi", "xid", "gpu", "refusals", "warnings"), ERRORS,
                         ids=[e[0].split("/")[1] for e in ERRORS])
def test_error_captures_give_the_expected_refusal_and_warning(
        smi: str, xid: str | None, gpu: Gpu, refusals: list[str], warnings: list[str]) -> None:
    """Captured on real hardware by the operators named in INDEX.md (stas00/ml-engineering's A100 with a
    pending remap and its Xid 63, an H100 runbook's -q and dmesg of one GPU, a GH200 in a simulator's
    fixture, an ECC section from a broken GPU, a throttled V100 in a Dell C4130), no GPU here. Fragments
    without a GPU line are judged directly; the others through their own PCI address."""
    healths = parse_smi_health(capture(smi))
    health = healths[0]
    events = parse_xids(capture(xid)) if xid else []
    v = verdict(gpu, health, events)
    if health.bus_id:
        assert HealthReport.parse(capture(smi), capture(xid) if xid else "").verdict(gpu) == v
    assert bool(v.refusals) == bool(refusals)
    for part in refusals:
        assert any(part in r for r in v.refusals), v.refusals
    for part in warnings:
        assert any(part in w for w in v.warnings), v.warnings
    for line in v.refusals + v.warnings:
        assert line.startswith(f"{gpu.label} (PCI {gpu.pci_bus_id}): ")


def test_fallen_off_the_bus_is_refused_until_reboot() -> None:
    """Two real captures combined on one host: the L40S idle -q (nvidia_gpu_exporter) and a journalctl
    Xid 79 line of another machine's GPU at the same PCI address 0000:01:00. No GPU here."""
    text = capture(L40S)
    gpu = parse_smi_query(text).gpus[0]
    (r,) = HealthReport.parse(text, capture(XID79)).verdict(gpu).refusals
    assert "Xid 79 (GPU has fallen off the bus) since boot" in r and "reboot" in r


def test_memory_xids_refuse_when_nvidia_smi_shows_no_live_state() -> None:
    """Captured on real hardware (the H100 runbook's dmesg), no GPU here: without a -q report for the GPU
    the Xid 48 and 63 lines are all there is, so they refuse; 94 (contained) only warns."""
    gpu = gpu_of("00000000:52:00.0", "NVIDIA H100 80GB HBM3", cc=(9, 0))
    v = HealthReport.parse("", capture(H100_XID)).verdict(gpu)
    assert len(v.refusals) == 1 and "Xid 48 (double-bit ECC error); Xid 63" in v.refusals[0]
    assert "Xid 94" in v.warnings[0]


def test_an_error_message_instead_of_a_report_gives_no_gpu() -> None:
    """Captured on real hardware (a driver/library mismatch, intel/llvm#17614), no GPU here."""
    assert parse_smi_health(capture("errors/nvml-mismatch-with-lib-version-550.144.txt")) == []


# --- the fact ---------------------------------------------------------------------------------------------
def framed(smi_q: str, xid: str, source: str = "journal") -> list[str]:
    query = capture("query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt").splitlines()[1:]
    rows = [", ".join(v.removesuffix(" MiB") for v in row.split(", ")) for row in query]
    head = capture("query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt").splitlines()[0].split(", ")
    want = [c.split(" [")[0] for c in head]
    fields = "index,uuid,name,memory.total,compute_cap,pci.bus_id,mig.mode.current"
    picked = [", ".join(r.split(", ")[want.index(f)] for f in fields.split(",")) for r in rows if r]
    return [f"{MARK} begin gpus", f"{MARK} fields {fields}", *picked, f"{MARK} rc 0", f"{MARK} end gpus",
            f"{MARK} begin health", *smi_q.splitlines(), f"{MARK} rc 0", f"{MARK} end health",
            f"{MARK} begin xid", f"{MARK} source {source}", *xid.splitlines(), f"{MARK} end xid",
            f"{MARK} begin driver", f"{MARK} source nvidia-smi", "590.48.01", f"{MARK} end driver"]


def test_the_fact_reads_health_in_the_same_command() -> None:
    """Captured on real hardware (H100, nvidia_gpu_exporter: its query and -q of one GPU), no GPU here."""
    fact = NvidiaGpus.__new__(NvidiaGpus)
    assert "nvidia-smi -q" in fact.command() and "journalctl -k -b" in fact.command()
    assert fact.command().index("nvidia-smi -q") < fact.command().index("fi; ")  # only with nvidia-smi
    out = fact.process(framed(capture(H100_IDLE), ""))
    gpu = out["gpus"][0]
    assert gpu.pci_bus_id == "00000000:00:09.0" and out["problem"] is None
    assert out["health"].xids_read and list(out["health"].gpus) == ["0000:00:09"]
    assert out["health"].verdict(gpu).refusals == ()


def test_an_unreadable_kernel_log_is_not_no_xid() -> None:
    """Captured on real hardware (H100, nvidia_gpu_exporter), no GPU here."""
    out = NvidiaGpus.__new__(NvidiaGpus).process(framed(capture(H100_IDLE), "", source="none"))
    assert out["health"].xids_read is False


# --- the plan ---------------------------------------------------------------------------------------------
def a100_host() -> HostFacts:
    """The A100 with a pending remap (stas00/ml-engineering) beside the idle H100 of another capture
    (nvidia_gpu_exporter), combined on one host as test_mixed_gpus does; the fragment has no memory or
    UUID, so those are 0 and ''."""
    h100 = parse_smi_query(capture(H100_IDLE)).gpus[0]
    gpus = (gpu_of("00000000:10:1C.0", "NVIDIA A100-SXM4-80GB"), Gpu(1, h100.uuid, h100.name,
            h100.memory_mib, h100.compute_capability, h100.pci_bus_id, minor=1))
    report = HealthReport.parse(capture(A100) + capture(H100_IDLE), capture(A100_XID))
    return HostFacts(gpus=gpus, gpu_health=report)


def test_a_new_instance_on_a_gpu_with_errors_is_refused_naming_host_instance_and_gpu() -> None:
    """Captured on real hardware (A100 remap pending + Xid 63, stas00/ml-engineering; idle H100), no GPU
    here."""
    (line,) = refused({"model": M, "name": "chat", "gpus": [0]}, a100_host())
    assert line.startswith(f"{HOST}: vllm.instances[chat].gpus: GPU 0 NVIDIA A100-SXM4-80GB (compute "
                           "capability 8.0) (PCI 00000000:10:1C.0): a row remap is pending")
    assert "`nvidia-smi -r -i 0`" in line and line.endswith("without such errors here: [1])")


def test_every_gpu_by_default_includes_the_bad_one_and_is_refused() -> None:
    """Captured on real hardware (as above), no GPU here."""
    assert any("GPU 0 NVIDIA A100" in p for p in refused({"model": M}, a100_host()))


def test_the_healthy_gpu_still_deploys_with_the_xid_history_warned() -> None:
    """Captured on real hardware (as above), no GPU here: the instance pinned to the H100 plans."""
    p = plan({"model": M, "gpus": [1]}, a100_host())
    assert p.instances[0].gpu_indexes == (1,)
    assert not any("A100" in w for w in p.warnings)


def test_an_instance_already_deployed_on_the_gpu_gets_a_warning() -> None:
    """Captured on real hardware (as above), no GPU here: vllm-default.service exists on the host."""
    facts = a100_host()
    facts = HostFacts(gpus=facts.gpus, gpu_health=facts.gpu_health, units=frozenset({"vllm-default.service"}))
    p = plan({"model": M, "gpus": [0]}, facts)
    assert p.instances[0].gpu_indexes == (0,)
    assert any(w.startswith(f"{HOST}: vllm.instances[default].gpus: already deployed here, so not refused: "
                            "GPU 0 NVIDIA A100-SXM4-80GB") and "pending" in w for w in p.warnings)
    assert any("Xid 63" in w for w in p.warnings)


def test_past_errors_only_warn_in_the_plan() -> None:
    """Captured on real hardware (GH200, one GPU, a simulator's fixture in a public repo), no GPU here."""
    text = capture(GH200)
    facts = HostFacts(gpus=tuple(parse_smi_query(text).gpus), gpu_health=HealthReport.parse(text, ""))
    p = plan({"model": M}, facts)
    assert [w for w in p.warnings if "GH200" in w] == [
        f"{HOST}: vllm.instances[default].gpus: GPU 0 NVIDIA GH200 480GB (compute capability 9.0) (PCI "
        "00000000:DD:00.0): 1 uncorrectable ECC error(s) in its lifetime (aggregate), none since the driver "
        "loaded; watch `nvidia-smi -q -d ECC -i 0` and RMA it if they keep coming"]


def test_no_health_read_changes_nothing() -> None:
    """Captured on real hardware (GH200), no GPU here: without the fact's health part, no message."""
    facts = HostFacts(gpus=tuple(parse_smi_query(capture(GH200)).gpus))
    assert plan({"model": M}, facts).warnings == ()


def test_an_unreadable_kernel_log_is_said_once() -> None:
    """Captured on real hardware (GH200), no GPU here."""
    text = capture(GH200)
    report = HealthReport(HealthReport.parse(text, "").gpus, {}, xids_read=False)
    facts = HostFacts(gpus=tuple(parse_smi_query(text).gpus), gpu_health=report)
    p = plan({"instances": [{"name": "a", "model": M}]}, facts)
    assert sum("kernel log could not be read" in w for w in p.warnings) == 1
