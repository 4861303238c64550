"""Whether a host's GPUs are healthy enough to be given to a new vLLM instance, read from the text of
``nvidia-smi -q`` and the kernel's NVRM Xid lines.

Pure parsing and judging: no I/O, so every rule is tested on real captured outputs
(tests/fixtures/nvidia, INDEX.md). The fact in ``roles/nvidia_facts.py`` only gathers the text.

Why: a GPU with uncorrectable memory errors, a pending row remap or one that fell off the bus lets vLLM
start and then fails requests or the whole engine minutes later. Refusing before the deploy names the GPU
and what to do while nothing has changed yet.

Why ``-q`` is read as an indentation tree: its layout changed across drivers (``Clocks Throttle
Reasons`` became ``Clocks Event Reasons``; ``SRAM Uncorrectable`` split into ``Parity`` and ``SEC-DED``;
``Single Bit``/``Double Bit`` subsections on pre-Ampere drivers), and operators paste fragments
(``-q -d ECC``, one section). Lookups are by section and key name under each ``GPU <bus id>`` block, so
a missing section reads as unknown, never as healthy or broken.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.core.gpus import Gpu, pci_key

_NA = {"", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error"}

# Clock event reasons that mean the GPU is slowed by something outside the workload (the hardware's own
# protection, a board power brake, the thermal limit); SW Power Cap and Idle are normal operation.
THROTTLE_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")

# Xids that mean the GPU is unusable until it is reset, the host is rebooted or the board replaced
# (NVIDIA's Xid catalogue, docs.nvidia.com/deploy/xid-errors, and GPU debug guidelines):
#   48  double-bit ECC error (DBE): uncorrectable memory error; the GPU needs a reset.
#   63  row remap / page retirement recorded: a reset is needed to apply it (Ampere+: row remapping).
#   64  row remap / page retirement failure: the repair failed; repeated after a reset means RMA.
#   79  GPU has fallen off the bus: it no longer answers on PCIe; only a reboot (or power cycle) helps.
#   95  uncontained ECC error: every process on the GPU is affected and the GPU must be reset.
#   119 GSP RPC timeout, 120 GSP error: the GPU's system processor stopped answering; reset or reboot.
# Left out on purpose, as warnings: 92 (high single-bit error rate: corrected, a trend to watch), 94
# (contained ECC error: only the process that hit it is affected; the pending remap it leaves is refused
# through "Remapped Rows"), and every other Xid (mostly application faults such as 13, 31, 43).
UNUSABLE_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error",
    63: "row remap / page retirement pending",
    64: "row remap / page retirement failure",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# Memory Xids whose live state nvidia-smi -q also shows (uncorrectable counters, pending remaps,
# pending retirements). Where -q reads that state for the GPU, it decides and these Xids only warn: the
# kernel log keeps them until a reboot, so refusing on them would outlast the `nvidia-smi -r` that fixed
# the GPU.
MEMORY_XIDS = frozenset({48, 63, 64, 95})


# --- nvidia-smi -q --------------------------------------------------------------------------------------
@dataclass
class _Node:
    value: str | None = None
    children: dict[str, _Node] = field(default_factory=dict)

    def find(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for name in path:
            node = node.children.get(name) if node else None
        return node

    def walk(self) -> Iterable[tuple[str, _Node]]:
        for name, child in self.children.items():
            yield name, child
            yield from child.walk()


_LINE = re.compile(r"^(?P<indent> *)(?P<key>\S[^:]*?)\s*(?::\s*(?P<value>.*?))?\s*$")


def _tree(lines: Iterable[str]) -> _Node:
    """The ``key : value`` lines as nested nodes, nesting by indentation (relative, so fragments pasted at
    any depth read the same)."""
    root = _Node()
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if not line.strip() or not match or match["key"].startswith(("[...]", "=")):
            continue
        indent = len(match["indent"])
        while stack[-1][0] >= indent:
            stack.pop()
        node = _Node(match["value"])
        stack[-1][1].children.setdefault(match["key"], node)
        stack.append((indent, node))
    return root


def _word(value: str | None) -> str | None:
    """A flag's value without what a person wrote after it (a runbook's ``Yes   <===``)."""
    if value is None or value.strip() in _NA:
        return None
    words = value.split()
    if value.strip().startswith("Not Active"):
        return "Not Active"
    return words[0] if words else None


def _int(value: str | None) -> int | None:
    word = _word(value)
    return int(word) if word is not None and word.isdigit() else None


def _uncorrectable(counters: _Node | None) -> int | None:
    """Uncorrectable errors in a Volatile/Aggregate subtree; None when none is reported (ECC off or not
    supported: every counter N/A). Ampere+ drivers print ``SRAM/DRAM Uncorrectable[ Parity|SEC-DED]``,
    older ones ``Double Bit`` with a ``Total``."""
    if counters is None:
        return None
    values: list[int | None] = []
    for name, node in counters.children.items():
        if "Uncorrectable" in name:
            values.append(_int(node.value))
        elif name == "Double Bit":
            values.append(_int(node.children["Total"].value) if "Total" in node.children else None)
    known = [v for v in values if v is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class GpuHealth:
    """What ``nvidia-smi -q`` says about one GPU's health. None everywhere means "not reported": ECC off
    or unsupported, a section the driver or the pasted fragment does not have."""

    bus_id: str | None  # as nvidia-smi prints it ("00000000:3B:00.0"); None for a fragment without one
    position: int  # place in the report: the nvidia-smi index
    minor: int | None = None  # /dev/nvidiaN
    name: str | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    retired_double_bit: int | None = None
    retirement_pending: bool | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle: tuple[str, ...] = ()  # active THROTTLE_REASONS
    persistence: bool | None = None

    @property
    def key(self) -> str | None:
        return pci_key(self.bus_id) if self.bus_id else None

    @property
    def memory_state_known(self) -> bool:
        """Whether -q shows the live memory state that MEMORY_XIDS describe."""
        return (self.ecc_volatile_uncorrectable is not None or self.remap_pending is not None
                or self.retirement_pending is not None)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _value(node: _Node | None) -> str | None:
    return node.value if node else None


def _flag(node: _Node | None) -> bool | None:
    word = _word(_value(node))
    return None if word is None else word in ("Yes", "Active", "Enabled")


def _gpu_health(bus_id: str | None, position: int, root: _Node) -> GpuHealth:
    ecc = root.find("ECC Errors")
    ecc_off = _word(_value(root.find("ECC Mode", "Current")))
    volatile = _uncorrectable(ecc.find("Volatile") if ecc else None)
    aggregate = _uncorrectable(ecc.find("Aggregate") if ecc else None)
    if ecc_off == "Disabled":
        volatile = aggregate = None
    pages = root.find("Retired Pages")
    pending_page = next((n for k, n in pages.children.items() if k.startswith("Pending")), None) \
        if pages else None
    rows = root.find("Remapped Rows")
    reasons = root.find("Clocks Event Reasons") or root.find("Clocks Throttle Reasons")
    active = {name for name, node in reasons.walk() if _flag(node)} if reasons else set()
    return GpuHealth(
        bus_id=bus_id, position=position,
        minor=_int(_value(root.find("Minor Number"))),
        name=_value(root.find("Product Name")),
        ecc_volatile_uncorrectable=volatile, ecc_aggregate_uncorrectable=aggregate,
        retired_double_bit=_int(_value(pages.find("Double Bit ECC"))) if pages else None,
        retirement_pending=_flag(pending_page),
        remapped_uncorrectable=_int(_value(rows.find("Uncorrectable Error"))) if rows else None,
        remap_pending=_flag(rows.find("Pending")) if rows else None,
        remap_failure=_flag(rows.find("Remapping Failure Occurred")) if rows else None,
        throttle=tuple(r for r in THROTTLE_REASONS if r in active),
        persistence=_flag(root.find("Persistence Mode")),
    )


_GPU_LINE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", re.M)


def parse_smi_health(text: str) -> list[GpuHealth]:
    """Each GPU of an ``nvidia-smi -q`` report (whole, ``-d``-filtered or a pasted fragment), in order.

    A fragment without a ``GPU <bus id>`` line is one GPU with ``bus_id`` None: it can be judged but not
    matched to a GPU of the host. An error message instead of a report gives [].
    """
    parts = _GPU_LINE.split(text)
    if len(parts) == 1:
        root = _tree(text.splitlines())
        health = _gpu_health(None, 0, root)
        return [health] if health != GpuHealth(None, 0) else []
    return [_gpu_health(bus, i, _tree(body.splitlines()))
            for i, (bus, body) in enumerate(zip(parts[1::2], parts[2::2], strict=True))]


# --- kernel log -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class XidEvent:
    bus_id: str  # as the kernel prints it ("0000:3b:00")
    xid: int
    message: str

    @property
    def key(self) -> str | None:
        return pci_key(self.bus_id)


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                  r"(?:\.[0-7])?\):\s*(?P<xid>\d+),\s*(?P<msg>.*?)\s*$")


def parse_xids(text: str) -> list[XidEvent]:
    """The ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...`` lines of a kernel log (dmesg, journalctl,
    syslog: any prefix), in order. Older drivers print the address without ``PCI:``."""
    return [XidEvent(m["pci"], int(m["xid"]), m["msg"]) for line in text.splitlines()
            if (m := _XID.search(line))]


@dataclass(frozen=True)
class HealthReport:
    """The fact's answer: the -q health of each GPU and the Xids since boot, both keyed by ``pci_key``.

    ``xids_read`` is False when the kernel log could not be read (no journal access, dmesg restricted):
    then no Xid is known, which is not the same as none.
    """

    gpus: Mapping[str, GpuHealth] = field(default_factory=dict)
    xids: Mapping[str, tuple[XidEvent, ...]] = field(default_factory=dict)
    xids_read: bool = True

    @classmethod
    def parse(cls, smi_q: str, kernel_log: str, xids_read: bool = True) -> HealthReport:
        gpus = {h.key: h for h in parse_smi_health(smi_q) if h.key}
        xids: dict[str, list[XidEvent]] = {}
        for event in parse_xids(kernel_log):
            if event.key:
                xids.setdefault(event.key, []).append(event)
        return cls(gpus, {k: tuple(v) for k, v in xids.items()}, xids_read)

    def verdict(self, gpu: Gpu) -> Verdict:
        key = pci_key(gpu.pci_bus_id)
        if key is None:
            return Verdict()
        return verdict(gpu, self.gpus.get(key), self.xids.get(key, ()))

    def to_json(self) -> dict[str, Any]:
        return {"gpus": dict(self.gpus), "xids": {k: [e.__dict__ for e in v] for k, v in self.xids.items()},
                "xids_read": self.xids_read}


# --- verdict --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _xid_list(events: Sequence[XidEvent]) -> str:
    seen: dict[int, str] = {}
    for e in events:
        seen.setdefault(e.xid, e.message)
    return "; ".join(f"Xid {x} ({UNUSABLE_XIDS.get(x, m)[:120]})" for x, m in seen.items())


def verdict(gpu: Gpu, health: GpuHealth | None, xids: Sequence[XidEvent] = ()) -> Verdict:
    """Refusals (the GPU must not be given to a new instance) and warnings for one GPU.

    Refused: uncorrectable ECC errors since the driver loaded (volatile), a failed or pending row remap,
    a pending page retirement, and the UNUSABLE_XIDS seen since boot (the memory ones only where -q does
    not show the live state, see MEMORY_XIDS). Warned: uncorrectable errors in the GPU's past
    (aggregate) and pages retired for them, active clock throttling, persistence mode off, other Xids.
    Each message names the GPU and says what to do; the caller adds host and instance.
    """
    name = f"{gpu.label} (PCI {gpu.pci_bus_id})"
    reset = f"drain it and reset it (`nvidia-smi -r -i {gpu.index}`) or reboot the host"
    refusals: list[str] = []
    warnings: list[str] = []
    h = health
    if h is not None:
        if h.remap_failure:
            refusals.append(f"{name}: row remapping failed (Remapping Failure Occurred: Yes): the GPU has no "
                            "spare rows left for its bad memory; drain it and RMA the board "
                            "(attach `nvidia-bug-report.sh` output)")
        elif h.remap_pending:
            refusals.append(f"{name}: a row remap is pending (Remapped Rows Pending: Yes): the bad memory "
                            f"row is still in use until the GPU is reset; {reset} to apply it")
        if h.retirement_pending:
            refusals.append(f"{name}: a page retirement is pending (Pending Page Blacklist: Yes); {reset} "
                            "to retire the page")
        if h.ecc_volatile_uncorrectable:
            refusals.append(f"{name}: {h.ecc_volatile_uncorrectable} uncorrectable ECC error(s) since the "
                            f"driver loaded (volatile); {reset}, and RMA it if they come back")
        elif h.ecc_aggregate_uncorrectable:
            warnings.append(f"{name}: {h.ecc_aggregate_uncorrectable} uncorrectable ECC error(s) in its "
                            "lifetime (aggregate), none since the driver loaded; watch "
                            f"`nvidia-smi -q -d ECC -i {gpu.index}` and RMA it if they keep coming")
        if h.retired_double_bit:
            warnings.append(f"{name}: {h.retired_double_bit} page(s) retired for double-bit errors; "
                            "RMA it when retirements keep growing")
        if h.throttle:
            warnings.append(f"{name}: clocks slowed by {', '.join(h.throttle)}: vLLM runs slower than "
                            "sized; check cooling, power cabling and the board's power brake signal")
        if h.persistence is False:
            warnings.append(f"{name}: persistence mode is off, so the driver re-initialises the GPU for "
                            "each process (slower start, lost state between runs); enable it with "
                            f"`nvidia-smi -pm 1 -i {gpu.index}` or the nvidia-persistenced service")
    live = h is not None and h.memory_state_known
    unusable = [e for e in xids if e.xid in UNUSABLE_XIDS and not (live and e.xid in MEMORY_XIDS)]
    superseded = [e for e in xids if e.xid in UNUSABLE_XIDS and e not in unusable]
    other = [e for e in xids if e.xid not in UNUSABLE_XIDS]
    if unusable:
        refusals.append(f"{name}: the kernel logged {_xid_list(unusable)} since boot; drain it and reboot "
                        "the host (a GPU reset may recover it, but the kernel log keeps the Xid until a "
                        "reboot); RMA it if it comes back")
    if superseded:
        warnings.append(f"{name}: the kernel logged {_xid_list(superseded)} since boot; nvidia-smi -q shows "
                        "no pending repair now, so it is taken as fixed")
    if other:
        warnings.append(f"{name}: the kernel logged {_xid_list(other)} since boot; look them up in NVIDIA's "
                        "Xid catalogue (https://docs.nvidia.com/deploy/xid-errors/) if the instance fails")
    return Verdict(tuple(refusals), tuple(warnings))
