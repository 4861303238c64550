"""Hosts whose GPUs are not all supported by the vLLM release: the unsupported one is left out, instances
on the others deploy, and only an instance pinned to it is refused.

The mixed host is the real capture smi_L/titanv-rtx5880ada-x2-570.86.15.txt (tests/fixtures/nvidia,
INDEX.md): a TITAN V (compute capability 7.0, below vLLM 0.33.0's 7.5) beside an RTX 5880 Ada (8.9), driver
570.86.15 as the source reports it. `nvidia-smi -L` prints no memory or bus id, so those are 0 and "" in
the Gpu objects built here; nothing below sizes memory. A second host puts the GPUs of two real table
captures on one machine: the table has one header (driver) per host, so no combined capture file was
written; the Gpu objects are combined in the test instead. The variant table is the real one.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.nvidia_captures import capture
from vllm_fleet.core.gpus import DriverVersion, Gpu, capability_from_name, parse_smi_list, parse_smi_table
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.spec import SpecError, parse_host
from vllm_fleet.core.variants import unusable_gpus

HOST = "mix-01"
ENV = {"VLLM_API_KEY": "k"}
M = {"name": "q", "path": "/srv/q"}
TITAN_V = "GPU 0 NVIDIA TITAN V (compute capability 7.0)"
WHY = ("no CUDA build of vLLM 0.33.0 has kernels for compute capability 7.0 (cu130: 7.5 8.0 8.6 8.9 9.0 "
       "10.0 12.0; cu129: 7.5 8.0 8.6 8.9 9.0 10.0 12.0; vLLM 0.33.0 needs 7.5 or newer)")


def mixed() -> HostFacts:
    listed = parse_smi_list(capture("smi_L/titanv-rtx5880ada-x2-570.86.15.txt"))
    gpus = tuple(Gpu(g.index, g.uuid, g.name, 0, capability_from_name(g.name) or (0, 0), "", minor=g.index)
                 for g in listed)
    return HostFacts(gpus=gpus, driver=DriverVersion.parse("570.86.15"))


def plan(data: dict, facts: HostFacts | None = None) -> HostPlan:
    spec = parse_host(HOST, {"version": "0.33.0", **data})
    return plan_host(HOST, spec, facts or mixed(), ENV)


def refused(data: dict, facts: HostFacts | None = None) -> list[str]:
    with pytest.raises(SpecError) as e:
        plan(data, facts)
    return e.value.problems


def two(a: object, b: object) -> dict:
    return {"instances": [{"name": "a", "model": M, "gpus": a},
                          {"name": "b", "model": M, "gpus": b, "flags": {"port": 8001}}]}


def test_the_capture_is_the_mixed_host_it_claims() -> None:
    facts = mixed()
    assert [(g.name, g.compute_capability) for g in facts.gpus] == [
        ("NVIDIA TITAN V", (7, 0)), ("NVIDIA RTX 5880 Ada Generation", (8, 9))]
    assert unusable_gpus("0.33.0", facts.driver, list(facts.gpus)) == {0: WHY}


@pytest.mark.parametrize("gpus", [None, 1, [1]])
def test_unset_count_or_pinned_to_the_supported_gpu_deploys(gpus: object) -> None:
    """`gpus` unset ("all") means every GPU vLLM can use here: the Ada card alone."""
    p = plan({"model": M, "gpus": gpus})
    inst = p.instances[0]
    assert inst.gpu_indexes == (1,)
    assert inst.environment["CUDA_VISIBLE_DEVICES"] == "GPU-7518f6b0-991f-ce2b-3d37-c779130d3137"
    assert inst.dtype == "bfloat16"  # from the Ada card (8.9), not the TITAN V
    # the build is chosen for the GPU the instance uses: cu129, since 570 is below cu130's 580.65.06
    assert p.variant == "cu129"
    assert p.variant_reason.endswith("covers 1x NVIDIA RTX 5880 Ada Generation (cc 8.9)")
    assert p.warnings == (f"{HOST}: {TITAN_V} is left out: {WHY}; instances with `gpus` unset or a count "
                          "take only GPUs [1]",)


def test_pinned_to_the_unsupported_gpu_is_refused_alone() -> None:
    lines = refused(two([0], [1]))
    assert lines == [f"{HOST}: vllm.instances[a].gpus: {TITAN_V} cannot be used: {WHY}; this host's usable "
                     "GPUs are [1]"]


def test_a_count_beyond_the_supported_gpus_is_refused_naming_the_one_left_out() -> None:
    assert refused({"model": M, "gpus": 2}) == [
        f"{HOST}: vllm.instances[default].gpus: asks for 2 GPU(s), the host has 1 free of the 1 it can use "
        f"({TITAN_V} is left out: {WHY})"]
    assert refused(two(None, 1)) == [
        f"{HOST}: vllm.instances[b].gpus: asks for 1 GPU(s), the host has 0 free of the 1 it can use "
        f"({TITAN_V} is left out: {WHY})"]
    assert refused(two(None, None)) == [
        f"{HOST}: vllm.instances[b].gpus: no GPU left for this instance ({TITAN_V} is left out: {WHY})"]


def test_a_host_of_only_unsupported_gpus_is_still_refused_as_a_whole() -> None:
    """smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt: its one GPU is below 7.5, nothing to deploy."""
    table = parse_smi_table(capture("smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt"))
    facts = HostFacts(gpus=tuple(g.to_gpu() for g in table.gpus), driver=table.driver)
    lines = refused({"model": M}, facts)
    assert len(lines) == 1
    assert lines[0].startswith(f"{HOST}: vllm.variant: GPU 0 Tesla P4 (compute capability 6.1) is not "
                               "supported by any CUDA build of vLLM 0.33.0")


def test_gpus_of_two_real_captures_on_one_host() -> None:
    """The Tesla P4 of smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt (its driver 550.135) beside the
    four H100 of smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt, renumbered 0-4 (P4 first)."""
    p4 = parse_smi_table(capture("smi_table/tesla-p4-x1-550.135-cuda12.4-TRUNC.txt"))
    h100 = parse_smi_table(capture("smi_table/h100-80gb-hbm3-x4-560.35.05-cuda12.6.txt"))
    rows = [g.to_gpu() for g in p4.gpus] + [g.to_gpu() for g in h100.gpus]
    gpus = tuple(Gpu(i, f"GPU-{i}", g.name, g.memory_mib, g.compute_capability, g.pci_bus_id, minor=i)
                 for i, g in enumerate(rows))
    facts = HostFacts(gpus=gpus, driver=p4.driver)
    p = plan(two(2, [3, 4]), facts)
    assert [i.gpu_indexes for i in p.instances] == [(1, 2), (3, 4)]
    assert p.variant == "cu129"
    assert p.variant_reason.endswith("covers 4x NVIDIA H100 80GB HBM3 (cc 9.0)")
    assert len(p.warnings) == 1 and p.warnings[0].startswith(
        f"{HOST}: GPU 0 Tesla P4 (compute capability 6.1) is left out: ")
    assert p.warnings[0].endswith("take only GPUs [1, 2, 3, 4]")
    lines = refused(two([0, 1], 2), facts)
    assert lines == [f"{HOST}: vllm.instances[a].gpus: GPU 0 Tesla P4 (compute capability 6.1) cannot be "
                     "used: no CUDA build of vLLM 0.33.0 has kernels for compute capability 6.1 (cu130: 7.5 "
                     "8.0 8.6 8.9 9.0 10.0 12.0; cu129: 7.5 8.0 8.6 8.9 9.0 10.0 12.0; vLLM 0.33.0 "
                     "needs 7.5 or newer); this host's usable GPUs are [1, 2, 3, 4]"]


@pytest.fixture()
def cu130_with_sm110(monkeypatch):
    """The table with cu130's list as vLLM 0.33.0's aarch64 wheel has it (sm_110 besides the x86_64
    list; tests/fixtures/cuobjdump/INDEX.md), so one arch is only in the build needing the newer driver;
    the packaged table holds the x86_64 lists, where cu130 and cu129 cover the same GPUs."""
    import vllm_fleet.core.variants as variants

    real = variants.load_table()
    rows = dict(real["0.33.0"])
    rows["cu130"] = dataclasses.replace(rows["cu130"], cuda_arch_list=tuple(
        variants.Arch.parse(a) for a in ("8.0", "8.6", "8.9", "9.0", "10.0", "11.0", "12.0")))
    monkeypatch.setattr(variants, "load_table", lambda: {**real, "0.33.0": rows})


def test_a_gpu_newer_than_every_builds_newest_arch_without_ptx_is_refused() -> None:
    """x86_64 table: no build of 0.33.0 has sm_110 (Thor) or PTX to JIT for it; 10.3 (B300) and 12.1
    (GB10) run the 10.0 and 12.0 kernels."""
    for cc, ok in (((11, 0), False), ((13, 0), False), ((10, 3), True), ((12, 1), True)):
        gpu = Gpu(0, "GPU-x", f"cc {cc}", 0, cc, "", minor=0)
        facts = HostFacts(gpus=(gpu,), driver=DriverVersion.parse("580.95.05"))
        if ok:
            assert plan({"model": M}, facts).variant == "cu130"
        else:
            assert f"compute capability {cc[0]}.{cc[1]}" in " ".join(refused({"model": M}, facts))


def test_a_gpu_only_a_newer_driver_supports_is_left_out_with_the_driver_to_install(cu130_with_sm110) -> None:
    """No capture has such a host, so the Gpu objects are written here: the RTX 5880 Ada captured above
    and a GPU of compute capability 11.0, in cu130's list only (Thor's; real Thor boards carry their own
    L4T driver, so this pairing only exercises the rule), on the 570 driver, below cu130's minimum. The
    Ada card deploys; the other GPU waits for a driver."""
    ada = mixed().gpus[1]
    thor = Gpu(0, "GPU-thor", "NVIDIA Thor", 0, (11, 0), "", minor=0)
    facts = HostFacts(gpus=(thor, ada), driver=DriverVersion.parse("570.86.15"))
    p = plan({"model": M}, facts)
    assert p.instances[0].gpu_indexes == (1,)
    assert p.warnings == (
        f"{HOST}: GPU 0 NVIDIA Thor (compute capability 11.0) is left out: only builds needing a newer "
        "driver have kernels for compute capability 11.0: install NVIDIA driver >= 580.65.06 (cu130) (this "
        "host has 570.86.15); instances with `gpus` unset or a count take only GPUs [1]",)


def test_a_pinned_build_leaves_out_what_its_arch_list_lacks(cu130_with_sm110) -> None:
    """The same two GPUs on a 580.95.05 driver with `variant: cu129` pinned: cu129 has no 11.0 kernels."""
    ada = mixed().gpus[1]
    thor = Gpu(0, "GPU-thor", "NVIDIA Thor", 0, (11, 0), "", minor=0)
    facts = HostFacts(gpus=(thor, ada), driver=DriverVersion.parse("580.95.05"))
    p = plan({"model": M, "variant": "cu129"}, facts)
    assert (p.variant, p.instances[0].gpu_indexes) == ("cu129", (1,))
    assert "the pinned cu129 build has no kernels for compute capability 11.0 (cu129: 7.5" in p.warnings[0]
    # unpinned, cu130 drives both
    both = plan({"model": M}, facts)
    assert (both.variant, both.instances[0].gpu_indexes, both.warnings) == ("cu130", (0, 1), ())
