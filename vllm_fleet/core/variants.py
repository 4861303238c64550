"""Which build of vLLM a host gets (cu130, cu129, cpu, ...), and the indexes and constraints its lock
is resolved with (vllm_fleet/core/lock.py).

Pure: the only I/O is reading the packaged table ``vllm_fleet/data/variants.toml``, which says per vLLM
release which builds exist, the driver each needs and the GPUs each was compiled for.

Why choose explicitly: uv's ``--torch-backend=auto`` picks torch's index from the driver, but not vLLM's
own wheel variant, so a host with a 550 driver would get PyPI's CUDA 13 vLLM beside a CUDA 12 torch. The
choice here is made from the host's facts and is the same on every run; a refusal names what to change.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from vllm_fleet.core.flags import version_tuple
from vllm_fleet.core.gpus import DriverVersion, Gpu

ACCELERATORS = ("cuda", "cpu")


class VariantRefusal(ValueError):
    """No build of the requested vLLM fits the host; the message says what to install or change."""


@dataclass(frozen=True)
class Arch:
    """One TORCH_CUDA_ARCH_LIST entry: "8.6" (SASS) or "12.0+PTX" (SASS plus forward-compatible PTX)."""

    major: int
    minor: int
    ptx: bool

    @classmethod
    def parse(cls, text: str) -> Arch:
        match = re.fullmatch(r"(\d+)\.(\d+)(\+PTX)?", text.strip())
        if not match:
            raise ValueError(f"not a CUDA arch: {text!r}")
        return cls(int(match[1]), int(match[2]), bool(match[3]))

    def runs_on(self, cc: tuple[int, int]) -> bool:
        # SASS runs on the same major at an equal or higher minor; PTX is JIT-compiled for anything newer.
        if cc[0] == self.major and cc[1] >= self.minor:
            return True
        return self.ptx and cc >= (self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}" + ("+PTX" if self.ptx else "")


@dataclass(frozen=True)
class Variant:
    """One build of one vLLM release, as the table describes it."""

    name: str
    vllm_version: str
    accelerator: str
    package: str
    spec: str
    cuda: str | None = None
    min_driver: DriverVersion | None = None
    cuda_arch_list: tuple[Arch, ...] = ()
    min_compute_capability: tuple[int, int] = (0, 0)
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    index_strategy: str | None = None
    remove_after_install: tuple[str, ...] = ()
    metadata_alias: str | None = None
    constraints: tuple[str, ...] = ()  # added to the lock's resolution (known broken pairs avoided)
    proven: bool = False
    proof: str = ""  # what the lab's tests prove of this build, or why they do not

    @property
    def cuda_key(self) -> tuple[int, ...]:
        return version_tuple(self.cuda) if self.cuda else ()

    def supports(self, cc: tuple[int, int]) -> bool:
        """Whether this build has kernels for a GPU of compute capability ``cc``."""
        return cc >= self.min_compute_capability and any(a.runs_on(cc) for a in self.cuda_arch_list)

    def arch_summary(self) -> str:
        return " ".join(str(a) for a in self.cuda_arch_list)

    def proof_line(self) -> str:
        """What an operator is told of this build's proof: a build the lab never ran is still checked by
        its own parser on each host before a restart, but nothing here has installed or served it."""
        return (f"proven on vllm-fleet's lab: {self.proof}" if self.proven
                else f"not proven on vllm-fleet's lab: {self.proof}")


@dataclass(frozen=True)
class VariantChoice:
    """What to install on a host, and why (the reason is shown to the operator in plans)."""

    variant: str
    reason: str
    release_dir: str  # "<vllm-version>-<variant>": /opt/vllm/releases/<release_dir>
    install_spec: str
    vllm_version: str
    build: Variant


# --- the table ------------------------------------------------------------------------------------------
def _variant(version: str, name: str, raw: dict[str, Any], min_cc: tuple[int, int]) -> Variant:
    accelerator = raw.get("accelerator")
    if accelerator not in ACCELERATORS:
        raise ValueError(f"variants.toml {version}/{name}: accelerator must be one of {ACCELERATORS}")
    spec = raw["spec"]
    if version not in spec or not spec.startswith(raw["package"]):
        raise ValueError(
            f"variants.toml {version}/{name}: spec {spec!r} does not pin {raw['package']} {version}"
        )
    has_cuda_fields = [f in raw for f in ("cuda", "min_driver", "cuda_arch_list")]
    if (accelerator == "cuda" and not all(has_cuda_fields)) or (
        accelerator == "cpu" and any(has_cuda_fields)
    ):
        raise ValueError(
            f"variants.toml {version}/{name}: cuda, min_driver and cuda_arch_list go with cuda only"
        )
    said = raw.get("proven", raw.get("unproven"))  # words a reader can follow, not a flag
    variant = Variant(
        name=name,
        vllm_version=version,
        accelerator=accelerator,
        package=raw["package"],
        spec=spec,
        cuda=raw.get("cuda"),
        min_driver=DriverVersion.parse(raw["min_driver"]) if "min_driver" in raw else None,
        cuda_arch_list=tuple(Arch.parse(a) for a in raw.get("cuda_arch_list", ())),
        min_compute_capability=min_cc if accelerator == "cuda" else (0, 0),
        index_url=raw.get("index_url"),
        extra_index_urls=tuple(raw.get("extra_index_urls", ())),
        index_strategy=raw.get("index_strategy"),
        remove_after_install=tuple(raw.get("remove_after_install", ())),
        metadata_alias=raw.get("metadata_alias"),
        constraints=tuple(raw.get("constraints", ())),
        proven="proven" in raw,
        proof=said.strip() if isinstance(said, str) else "",
    )
    if ("proven" in raw) == ("unproven" in raw) or not variant.proof:
        raise ValueError(f"variants.toml {version}/{name}: give exactly one of proven (what the lab's tests "
                         "prove, naming the test) and unproven (why they do not)")
    return variant


def parse_table(text: str) -> dict[str, dict[str, Variant]]:
    """{vLLM version: {variant name: Variant}} from the TOML text; CUDA builds newest CUDA first."""
    data = tomllib.loads(text)
    if data.get("schema") != 1:
        raise ValueError("variants.toml: unknown schema (expected schema = 1)")
    table = {}
    for version, release in data.get("release", {}).items():
        if not re.fullmatch(r"\d+(\.\d+)*", version):  # a malformed version fails here, at load time
            raise ValueError(f"the release table: release {version!r} is not a version")
        min_cc = tuple(int(p) for p in release.get("min_compute_capability", "0.0").split("."))
        variants = [
            _variant(version, n, raw, (min_cc[0], min_cc[1])) for n, raw in release["variant"].items()
        ]
        variants.sort(key=lambda v: (v.accelerator != "cuda", tuple(-k for k in v.cuda_key)))
        table[version] = {v.name: v for v in variants}
    return table


@cache
def load_table() -> dict[str, dict[str, Variant]]:
    """The packaged table (read once per process)."""
    table = resources.files("vllm_fleet").joinpath("data", "variants.toml")
    return parse_table(table.read_text(encoding="utf-8"))


# --- the choice -----------------------------------------------------------------------------------------
def _gpu_summary(gpus: list[Gpu]) -> str:
    counts: dict[tuple[str, tuple[int, int]], int] = {}
    for gpu in gpus:
        counts[(gpu.name, gpu.compute_capability)] = counts.get((gpu.name, gpu.compute_capability), 0) + 1
    return ", ".join(f"{n}x {name} (cc {cc[0]}.{cc[1]})" for (name, cc), n in counts.items())


def _misfit(variant: Variant, driver: DriverVersion, gpus: list[Gpu]) -> str | None:
    """Why ``variant`` cannot run on this host, or None when it can."""
    assert variant.min_driver is not None
    if driver < variant.min_driver:
        return f"driver {driver} is below its minimum {variant.min_driver}"
    unsupported = [g for g in gpus if not variant.supports(g.compute_capability)]
    if unsupported:
        gpu = unsupported[0]
        cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
        return f"GPU {gpu.index} {gpu.name} (cc {cc}) is not in its arch list {variant.arch_summary()}"
    return None


def _chosen(variant: Variant, reason: str) -> VariantChoice:
    return VariantChoice(
        variant=variant.name,
        reason=reason,
        release_dir=f"{variant.vllm_version}-{variant.name}",
        install_spec=variant.spec,
        vllm_version=variant.vllm_version,
        build=variant,
    )


def _driver_advice(variants: list[Variant], gpus: list[Gpu]) -> str:
    """'>= 525.60.13 (cu129) or >= 580.65.06 (cu130)' over the builds that would take every GPU."""
    fitting = [v for v in variants if all(v.supports(g.compute_capability) for g in gpus)]
    ordered = sorted(fitting, key=lambda v: v.min_driver or DriverVersion((0,), "0"))
    return " or ".join(f">= {v.min_driver} ({v.name})" for v in ordered)


def unusable_gpus(
    vllm_version: str,
    driver: DriverVersion | None,
    gpus: list[Gpu],
    override: str | None = None,
) -> dict[int, str]:
    """{GPU index: why no build of ``vllm_version`` this host can run has kernels for it}.

    Why per GPU: one old card (a compute capability below the release's minimum, or an arch that no
    build's list covers, or covered only by a build whose driver minimum this host misses) must not stop
    the instances on the other GPUs. Only GPU-specific reasons count: what fails for the whole host (no
    driver, a Jetson, a driver older than every build, an unknown version or override) returns {} and is
    ``choose_variant``'s to refuse. The reasons are host-independent and do not name the GPU.
    """
    release = load_table().get(vllm_version)
    if release is None or driver is None or driver.l4t or (override is not None and override not in release):
        return {}
    builds = [release[override]] if override else [v for v in release.values() if v.accelerator == "cuda"]
    runnable = [v for v in builds if v.accelerator == "cuda" and v.min_driver and driver >= v.min_driver]
    if not runnable:
        return {}
    out = {}
    for gpu in gpus:
        covering = [v for v in builds if v.supports(gpu.compute_capability)]
        if not covering:
            lists = "; ".join(f"{v.name}: {v.arch_summary()}" for v in builds)
            minimum = builds[0].min_compute_capability
            if gpu.compute_capability < minimum:
                lists += f"; vLLM {vllm_version} needs {'.'.join(map(str, minimum))} or newer"
            what = (f"the pinned {override} build has no" if override
                    else f"no CUDA build of vLLM {vllm_version} has")
            out[gpu.index] = f"{what} kernels for compute capability {gpu.cc} ({lists})"
        elif not any(v in runnable for v in covering):
            advice = " or ".join(f">= {v.min_driver} ({v.name})" for v in covering)
            out[gpu.index] = (f"only builds needing a newer driver have kernels for compute capability "
                              f"{gpu.cc}: install NVIDIA driver {advice} (this host has {driver})")
    return out


def choose_variant(
    vllm_version: str,
    accelerator: str,
    driver: DriverVersion | None,
    gpus: list[Gpu],
    override: str | None = None,
) -> VariantChoice:
    """The build of ``vllm_version`` to install: the newest CUDA whose driver minimum is met and whose
    arch list covers every GPU of the host (``accelerator: cpu`` takes the CPU build).

    ``override`` names a variant the operator insists on; it is checked against the same table and the
    same rules, so it can pin an older CUDA but never one the host cannot run. Raises VariantRefusal,
    whose message is host-independent (the caller adds the host name) and says what to install.
    """
    table = load_table()
    if accelerator not in ACCELERATORS:
        raise VariantRefusal(f"accelerator must be one of {', '.join(ACCELERATORS)}, not {accelerator!r}")
    if vllm_version not in table:
        known = ", ".join(sorted(table, key=version_tuple))
        raise VariantRefusal(f"vLLM {vllm_version} is not in the release table (known: {known}; "
                             "`vllm-fleet explain version`)")
    release = table[vllm_version]
    if override is not None:
        if override not in release:
            raise VariantRefusal(
                f"override {override!r} is not a build of vLLM {vllm_version} (builds: {', '.join(release)})"
            )
        if release[override].accelerator != accelerator:
            raise VariantRefusal(
                f"override {override!r} is a {release[override].accelerator} build but the host's "
                f"accelerator is {accelerator}: change one of them"
            )

    if accelerator == "cpu":
        cpu = [v for v in release.values() if v.accelerator == "cpu"]
        if not cpu:
            raise VariantRefusal(f"vLLM {vllm_version} has no CPU build in the release table "
                                 "(`vllm-fleet explain version`)")
        variant = release[override] if override else cpu[0]
        return _chosen(variant, f"{variant.name}: accelerator is cpu, so the CPU build {variant.spec}")

    cuda = [v for v in release.values() if v.accelerator == "cuda"]
    if not cuda:
        raise VariantRefusal(f"vLLM {vllm_version} has no CUDA build in the release table "
                             "(`vllm-fleet explain version`)")
    if driver is None:
        advice = _driver_advice(cuda, gpus)
        raise VariantRefusal(
            f"no NVIDIA driver found: install NVIDIA driver {advice}, or set accelerator: cpu"
        )
    if driver.l4t:
        raise VariantRefusal(
            f"{driver} is a Jetson (L4T) driver: vLLM {vllm_version}'s CUDA wheels are built for discrete "
            "and server GPUs, not Jetson; build vLLM from source for Jetson or set accelerator: cpu"
        )
    if not gpus:
        raise VariantRefusal(
            f"driver {driver} is installed but no NVIDIA GPU is visible: check that the GPUs are present and "
            "passed through, or set accelerator: cpu"
        )

    # GPUs that no CUDA build of this release can drive: no driver upgrade helps, so say so first.
    orphans = [g for g in gpus if not any(v.supports(g.compute_capability) for v in cuda)]
    if orphans:
        gpu = orphans[0]
        builds = "; ".join(f"{v.name}: {v.arch_summary()}" for v in cuda)
        needed = ".".join(map(str, cuda[0].min_compute_capability))
        raise VariantRefusal(
            f"{gpu.label} is not supported by any CUDA build of "
            f"vLLM {vllm_version} ({builds}); vLLM needs compute capability {needed} or newer: remove the "
            "GPU from this host's deployment or pin an older vLLM"
        )

    candidates = [release[override]] if override else cuda
    skipped: list[str] = []
    for variant in candidates:
        why_not = _misfit(variant, driver, gpus)
        if why_not is None:
            if override:
                how = "pinned by override"
            elif not skipped:
                how = "the newest CUDA build"
            else:
                how = "the newest that fits; not " + "; not ".join(skipped)
            return _chosen(
                variant,
                f"{variant.name} (CUDA {variant.cuda}, {how}): driver {driver} >= {variant.min_driver}, "
                f"and its arch list covers {_gpu_summary(gpus)}",
            )
        skipped.append(f"{variant.name} ({why_not})")

    if all(driver < v.min_driver for v in candidates if v.min_driver is not None):
        builds = f"the {override} build" if override else "every CUDA build"
        advice = _driver_advice(candidates, gpus)
        raise VariantRefusal(
            f"driver {driver} is older than {builds} of vLLM {vllm_version}: install NVIDIA driver {advice}"
        )
    advice = _driver_advice(cuda, gpus)
    raise VariantRefusal(
        f"no CUDA build of vLLM {vllm_version} fits: {'; '.join(skipped)}"
        + (f": install NVIDIA driver {advice}" if advice else "")
    )
