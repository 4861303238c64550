"""What a host's NVIDIA GPUs and driver are, read from the text that nvidia-smi and the kernel print.

Pure parsing: every function takes the text a command printed and returns values, so the facts in
``roles/nvidia_facts.py`` stay thin and everything here is tested on real captured outputs.

Why so many input forms: the facts query ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``, but
what operators paste (and what old hosts print) is the ``nvidia-smi`` table, ``nvidia-smi -q``,
``nvidia-smi -L`` or ``/proc/driver/nvidia/version``. Each has a parser, and ``classify_nvidia_error``
turns any of them that is really an error into a problem with an action for the operator.

Compute capability: taken from ``compute_cap`` when nvidia-smi reports it (drivers from about R510 on);
older nvidia-smi rejects that field, and the table, ``-L`` and ``-q`` never show it, so it then comes from
the GPU name (``capability_from_name``). An unknown name without ``compute_cap`` is an error, never a guess.

MIG: detected from what each form shows, because a GPU in MIG mode cannot be handed to vLLM whole:
``mig.mode.current`` as an extra query field (``MIG_FIELD``; the facts query it whenever nvidia-smi knows
it), the ``MIG M.`` column and ``MIG devices:`` box of the table, ``MIG Mode / Current`` in ``-q``, and
the ``MIG ...  Device N:`` lines of ``-L``. ``-L`` alone misses a GPU in MIG mode with no instances
created, which is why the query field is the primary source.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

QUERY_FIELDS = "index,uuid,name,memory.total,compute_cap,pci.bus_id"
# For nvidia-smi older than compute_cap (it answers 'Field "compute_cap" is not a valid field to query.').
QUERY_FIELDS_NO_CC = "index,uuid,name,memory.total,pci.bus_id"
# Optional last field: 'Enabled' / 'Disabled', '[N/A]' on GPUs without MIG. Known to nvidia-smi since R450.
MIG_FIELD = "mig.mode.current"

_REQUIRED_FIELDS = ("index", "uuid", "name", "memory.total", "pci.bus_id")
_NA = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported"}


class NvidiaOutputError(ValueError):
    """nvidia-smi printed something that is not the data asked for (often an error message)."""


class UnknownGpuError(ValueError):
    """A GPU whose compute capability is neither reported nor known from its name."""


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the plan needs it (MIG instances are not GPUs here)."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    pci_bus_id: str
    # 'Enabled' / 'Disabled' when known; None where MIG does not apply or was not queried.
    mig_mode: str | None = None
    # the N of /dev/nvidiaN (the driver's device minor); None: not read. Not the index: nvidia-smi
    # numbers GPUs in PCI bus order, the driver its minors in probe order (see with_minors).
    minor: int | None = None

    def to_json(self) -> dict[str, Any]:
        """What `pyinfra ... fact` prints for it (its JSON encoder calls to_json)."""
        return asdict(self)

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    @property
    def label(self) -> str:
        """How every refusal and warning names a GPU."""
        return f"GPU {self.index} {self.name} (compute capability {self.cc})"


@dataclass(frozen=True, order=True)
class DriverVersion:
    """A kernel driver version, ordered numerically part by part (550.135 > 550.54.15).

    ``text`` keeps the printed form, because NVIDIA zero-pads parts ("580.65.06") and a message must show
    the version the operator will search for. ``l4t`` marks a Jetson: its NVRM line carries the L4T
    release (e.g. 35.3.1), which is not comparable with desktop/datacenter driver branches.
    """

    parts: tuple[int, ...]
    text: str = field(compare=False)
    l4t: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, text: str, *, l4t: bool = False) -> DriverVersion:
        text = text.strip()
        if not re.fullmatch(r"\d+(?:\.\d+){1,3}", text):
            raise ValueError(f"not a driver version: {text!r}")
        return cls(tuple(int(p) for p in text.split(".")), text, l4t)

    def __str__(self) -> str:
        return f"L4T {self.text}" if self.l4t else self.text

    def to_json(self) -> str:
        return str(self)


# --- compute capability from the GPU name -------------------------------------------------------------
# Searched in order against the name without its "NVIDIA " prefix; specific names come before the
# families they would otherwise fall into (Ada workstation cards before GeForce RTX 50xx, ...).
# Values: NVIDIA's CUDA GPU list (https://developer.nvidia.com/cuda-gpus). GeForce families require
# "GeForce" so that workstation cards sharing digits (RTX 5000 Ada, Quadro RTX 5000) never match them,
# and a 3-digit prefix so that names cut by nvidia-smi's table ("GeForce RTX 2080 ...") still resolve.
_CAPABILITY_BY_NAME: tuple[tuple[str, tuple[int, int]], ...] = (
    # datacenter
    (r"\bGB10\b", (12, 1)),  # DGX Spark
    (r"\bG?B300\b", (10, 3)),
    (r"\bG?B200\b|\bB100\b", (10, 0)),
    (r"\bGH200\b|\bH(?:100|200|800|20)\b", (9, 0)),
    (r"\bA(?:100|800|30)\b", (8, 0)),
    (r"\bA(?:40|10G?|16|2)\b", (8, 6)),
    (r"\bL(?:40S|40|20|4|2)\b", (8, 9)),
    (r"\bT4\b", (7, 5)),
    (r"\bV100S?\b", (7, 0)),
    (r"\bP100\b", (6, 0)),
    (r"\bP(?:40|6|4)\b", (6, 1)),
    (r"\bM(?:60|40)\b", (5, 2)),
    (r"\bK80\b", (3, 7)),
    (r"\bK(?:40|20X?)\b", (3, 5)),
    # embedded
    (r"\bThor\b", (11, 0)),
    (r"\bOrin\b", (8, 7)),
    (r"\bXavier\b", (7, 2)),
    # workstation
    (r"\bRTX PRO\b", (12, 0)),  # every RTX PRO is Blackwell (6000/5000/4500/4000/2000, laptop 500-5000)
    (r"\bRTX 6000D\b", (12, 0)),  # China-market Blackwell RTX PRO 6000D
    (r"\bRTX \d{3,4}\s+(?:SFF\s+)?Ada\b", (8, 9)),  # RTX 6000 / 5880 / 4000 SFF Ada Generation
    (r"\bRTX A\d{3,4}\b", (8, 6)),  # RTX A6000 ... A500
    (r"\bQuadro RTX\b", (7, 5)),
    (r"\bQuadro GV100\b", (7, 0)),
    (r"\bQuadro GP100\b", (6, 0)),
    (r"\bQuadro P\d{3,4}\b", (6, 1)),
    (r"\bQuadro K(?:6000|5200)\b", (3, 5)),
    (r"\bQuadro K\d{3,4}M?\b", (3, 0)),
    (r"\bTITAN RTX\b", (7, 5)),
    (r"\bTITAN V\b", (7, 0)),
    (r"\bTITAN Xp\b|\bTITAN X \(Pascal\)", (6, 1)),
    (r"\bGTX TITAN X\b", (5, 2)),
    # GeForce
    (r"\bGeForce RTX 50\d", (12, 0)),
    (r"\bGeForce RTX 40\d", (8, 9)),
    (r"\bGeForce RTX 30\d", (8, 6)),
    (r"\bGeForce RTX 20\d", (7, 5)),
    (r"\bGeForce GTX 16\d", (7, 5)),
    (r"\bGeForce GTX 10\d", (6, 1)),
    (r"\bGeForce GTX 9\d\d\b", (5, 2)),
    (r"\bGeForce GTX 750", (5, 0)),
    (r"\bGeForce GTX 780", (3, 5)),
    (r"\bGeForce GTX [67]\d\d\b", (3, 0)),
)
_CAPABILITY_PATTERNS = tuple((re.compile(p, re.IGNORECASE), cc) for p, cc in _CAPABILITY_BY_NAME)


def capability_from_name(name: str) -> tuple[int, int] | None:
    """Compute capability for a GPU name as nvidia-smi prints it, or None if the name is not known."""
    bare = re.sub(r"^NVIDIA\s+", "", name.strip(), flags=re.IGNORECASE)
    for pattern, cc in _CAPABILITY_PATTERNS:
        if pattern.search(bare):
            return cc
    return None


def parse_compute_capability(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if not match:
        raise ValueError(f"not a compute capability: {text!r}")
    return int(match[1]), int(match[2])


def _capability(index: int, name: str, reported: str | None) -> tuple[int, int]:
    if reported is not None:
        return parse_compute_capability(reported)
    cc = capability_from_name(name)
    if cc is None:
        cut = " (nvidia-smi's table cut the name short)" if name.endswith("...") else ""
        raise UnknownGpuError(
            f"GPU {index} {name!r}{cut}: nvidia-smi reports no compute capability and the name is not in "
            "vllm_fleet.core.gpus' name table; use an nvidia-smi that supports compute_cap (driver R510+) or "
            "add the name to _CAPABILITY_BY_NAME"
        )
    return cc


def _mib(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*(?:MiB)?\s*", text)
    if not match:
        raise ValueError(f"not a size in MiB: {text!r}")
    return int(match[1])


# --- --query-gpu CSV ----------------------------------------------------------------------------------
def _header_name(cell: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]$", "", cell.strip())  # "memory.total [MiB]" -> "memory.total"


def parse_query_rows(text: str, fields: str | None = None) -> list[dict[str, str | None]]:
    """Rows of ``--query-gpu`` CSV as {field: value}; N/A values become None.

    ``fields=None`` reads the field names from a header line (``--format=csv`` with header); given
    fields, a header line that repeats them is skipped, so both formats parse. Units ("81559 MiB") are
    left in the values for the callers that convert them.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    names = [f.strip() for f in fields.split(",")] if fields else None
    if lines and (names is None or [_header_name(c) for c in lines[0].split(",")] == names):
        header = [_header_name(c) for c in lines[0].split(",")]
        names, lines = (names or header), lines[1:]
    if names is None:
        raise NvidiaOutputError("no header line and no field list: cannot tell the columns apart")
    rows = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(names):
            raise NvidiaOutputError(
                f"expected {len(names)} values ({','.join(names)}), got: {line.strip()!r}"
            )
        rows.append({n: (None if c in _NA else c) for n, c in zip(names, cells, strict=True)})
    return rows


def parse_query_csv(text: str, fields: str | None = QUERY_FIELDS) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` (or csv with header).

    Falls back to the name table when ``compute_cap`` is not among the fields or reads N/A.
    """
    gpus = []
    for row in parse_query_rows(text, fields):
        missing = [f for f in _REQUIRED_FIELDS if row.get(f) is None]
        if missing:
            raise NvidiaOutputError(f"query output lacks {', '.join(missing)}: {row}")
        index, name = int(row["index"] or ""), row["name"] or ""
        gpus.append(
            Gpu(
                index=index,
                uuid=row["uuid"] or "",
                name=name,
                memory_mib=_mib(row["memory.total"] or ""),
                compute_capability=_capability(index, name, row.get("compute_cap")),
                pci_bus_id=row["pci.bus_id"] or "",
                mig_mode=row.get(MIG_FIELD),
            )
        )
    return gpus


# --- driver version -------------------------------------------------------------------------------------
_KMD = re.compile(r"\bKMD Version\s*:\s*(\d+(?:\.\d+)+)", re.IGNORECASE)
_DRIVER = re.compile(r"\bDriver Version\s*:\s*(\d+(?:\.\d+)+)", re.IGNORECASE)
_NVRM = re.compile(r"^NVRM version:.*?Kernel Module(?: for (?P<arch>\S+))?\s+(?P<ver>\d+(?:\.\d+)+)\s", re.M)
_MODINFO = re.compile(r"^version:\s+(\d+(?:\.\d+)+)\s*$", re.M)
# A bare "550.54.15" line (--query-gpu=driver_version); driver majors have three digits, which keeps a
# compute capability ("8.9") or a CUDA version from passing for one.
_BARE = re.compile(r"^\s*(\d{3}(?:\.\d+){1,2})\s*$", re.M)


def parse_driver_version(text: str) -> DriverVersion:
    """The kernel driver version from whichever of these the text is.

    Accepted: ``--query-gpu=driver_version --format=csv[,noheader]``; the ``nvidia-smi`` table header
    ("Driver Version:", or "KMD Version:" from R610 on); ``nvidia-smi --version`` and ``-q``;
    ``/proc/driver/nvidia/version`` (proprietary "Kernel Module  384.98" and open "Open Kernel Module for
    x86_64  525.60.11" forms); ``modinfo nvidia`` ("version: 450.142.00", the module on disk).

    The driver, not nvidia-smi, is what counts: a table whose "NVIDIA-SMI 470.256.02" differs from its
    "Driver Version: 580.95.05" yields 580.95.05.

    Jetson: its NVRM line ("Open Kernel Module for aarch64  35.3.1") carries the L4T release, not a
    driver branch. It yields ``DriverVersion((35, 3, 1), l4t=True)``, printed "L4T 35.3.1", so that variant
    choice can refuse it by name instead of calling it "older than 525". Told apart from aarch64 server
    drivers (GH200: 5xx and up) by the number: L4T releases are below 100.
    """
    for pattern in (_KMD, _DRIVER):
        if match := pattern.search(text):
            return DriverVersion.parse(match[1])
    if match := _NVRM.search(text):
        version = match["ver"]
        jetson = match["arch"] == "aarch64" and int(version.split(".")[0]) < 100
        return DriverVersion.parse(version, l4t=jetson)
    if match := _MODINFO.search(text):
        return DriverVersion.parse(match[1])
    if match := _BARE.search(text):
        return DriverVersion.parse(match[1])
    snippet = text.strip().splitlines()[0][:120] if text.strip() else "(empty)"
    raise NvidiaOutputError(f"no NVIDIA driver version in: {snippet!r}")


# --- nvidia-smi table, -L and -q ------------------------------------------------------------------------
class SmiTableGpu(NamedTuple):
    index: int  # type: ignore[assignment]  # the GPU's index, as nvidia-smi names it; shadows tuple.index
    name: str  # as shown: the old 79-column table cuts long names ("Tesla V100-SXM2...")
    memory_mib: int | None  # None when the capture ends before the row's memory line
    bus_id: str
    mig_mode: str | None = None  # the "MIG M." cell: 'Enabled' / 'Disabled'; None when N/A or absent

    def to_gpu(self, uuid: str = "") -> Gpu:
        """A Gpu for variant choice; the table shows no UUID, so it is '' unless given."""
        if self.memory_mib is None:
            raise NvidiaOutputError(f"GPU {self.index}: the table row has no memory line")
        cc = _capability(self.index, self.name, None)
        return Gpu(self.index, uuid, self.name, self.memory_mib, cc, self.bus_id, self.mig_mode)


class SmiTable(NamedTuple):
    driver: DriverVersion | None
    cuda_version: str | None  # highest CUDA the driver supports; None when "N/A" or not shown
    gpus: list[SmiTableGpu]


_TABLE_HEADER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\d+(?:\.\d+)+)\s+(?:Driver|KMD) Version:\s*(?P<driver>\d+(?:\.\d+)+)"
    r"(?:\s+CUDA(?: UMD)? Version:\s*(?P<cuda>\d+\.\d+|N/A))?"
)
_TABLE_ROW = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?:On|Off)\s*\|\s*"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s+(?:On|Off|N/A)\s*\|"
)
_TABLE_MEMORY = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_TABLE_MIG = re.compile(r"\|\s*(Enabled|Disabled|N/A)\s*\|\s*$")


def parse_smi_table(text: str) -> SmiTable:
    """Driver, CUDA version and GPU rows of the plain ``nvidia-smi`` table, old and new layouts."""
    header = _TABLE_HEADER.search(text)
    driver = DriverVersion.parse(header["driver"]) if header else None
    cuda = header["cuda"] if header and header["cuda"] not in (None, "N/A") else None
    lines = text.splitlines()
    gpus = []
    for i, line in enumerate(lines):
        row = _TABLE_ROW.match(line)
        if not row:
            continue
        memory = mig = None
        if i + 1 < len(lines) and (mem := _TABLE_MEMORY.search(lines[i + 1])):
            memory = int(mem[2])
            if i + 2 < len(lines) and lines[i + 2].startswith("|") and (m := _TABLE_MIG.search(lines[i + 2])):
                mig = None if m[1] == "N/A" else m[1]
        gpus.append(SmiTableGpu(int(row["index"]), row["name"].strip(), memory, row["bus"], mig))
    return SmiTable(driver, cuda, gpus)


class SmiListGpu(NamedTuple):
    index: int  # type: ignore[assignment]  # the GPU's index, as nvidia-smi names it; shadows tuple.index
    name: str
    uuid: str
    mig_devices: tuple[str, ...]  # MIG profiles listed under the GPU ("1g.20gb", ...)


_LIST_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: MIG-[0-9A-Fa-f-]+\)")


def parse_smi_list(text: str) -> list[SmiListGpu]:
    """GPUs of ``nvidia-smi -L`` with the MIG devices shown under each."""
    found: list[tuple[int, str, str, list[str]]] = []
    for line in text.splitlines():
        if gpu := _LIST_GPU.match(line):
            found.append((int(gpu[1]), gpu[2], gpu[3], []))
        elif (mig := _LIST_MIG.match(line)) and found:
            found[-1][3].append(mig[1])
    return [SmiListGpu(i, n, u, tuple(m)) for i, n, u, m in found]


class SmiQuery(NamedTuple):
    driver: DriverVersion | None
    cuda_version: str | None
    gpus: list[Gpu]


def _q_value(line: str) -> str:
    return line.split(":", 1)[1].strip() if ":" in line else ""


def parse_smi_query(text: str) -> SmiQuery:
    """Driver, CUDA version and GPUs of ``nvidia-smi -q``.

    GPUs are numbered in the order listed (nvidia-smi's own order, the one ``--query-gpu`` index uses);
    ``minor`` is the "Minor Number" shown, which need not be that number.
    Only the GPU's own "FB Memory Usage" total counts, not the "Shared FB Memory Usage" of MIG devices.
    """
    driver = parse_driver_version(text) if _DRIVER.search(text) or _KMD.search(text) else None
    cuda_match = re.search(r"^CUDA UMD Version\s*:\s*(\d+\.\d+)", text, re.M) or re.search(
        r"^CUDA Version\s*:\s*(\d+\.\d+)", text, re.M
    )
    blocks = re.split(
        r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", text, flags=re.M
    )
    gpus = []
    for index, (bus, body) in enumerate(zip(blocks[1::2], blocks[2::2], strict=True)):
        lines = body.splitlines()
        # The GPU's own attributes are indented by exactly four spaces; deeper ones belong to sub-sections.
        values = {m[1]: m[2] for ln in lines if (m := re.match(r"^ {4}(\S[^:]*?)\s*:\s*(.*)$", ln))}
        memory = mig = None
        for i, ln in enumerate(lines):
            if ln.rstrip() == "    FB Memory Usage" and i + 1 < len(lines):
                memory = _mib(_q_value(lines[i + 1]))
            elif ln.rstrip() == "    MIG Mode" and i + 1 < len(lines):
                mig = _q_value(lines[i + 1])
        name = values.get("Product Name", "")
        if memory is None:
            raise NvidiaOutputError(f"GPU {bus}: no FB Memory Usage total in -q output")
        cc = _capability(index, name, None)
        minor = values.get("Minor Number", "")
        gpus.append(
            Gpu(index, values.get("GPU UUID", ""), name, memory, cc, bus, None if mig in _NA else mig,
                int(minor) if minor.isdigit() else None)
        )
    return SmiQuery(driver, cuda_match[1] if cuda_match else None, gpus)


# --- device minor numbers ------------------------------------------------------------------------------
_Q_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", re.M)
_Q_MINOR = re.compile(r"^ {4}Minor Number\s*:\s*(\d+)\s*$", re.M)
_Q_UUID = re.compile(r"^ {4}GPU UUID\s*:\s*(GPU-\S+)\s*$", re.M)
_PROC_LINE = re.compile(r"^(GPU UUID|Bus Location|Device Minor)\s*:\s*(\S+)\s*$")


_PCI = re.compile(r"(?:PCI:)?([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?")


def pci_key(bus_id: str) -> str | None:
    """One spelling for a PCI address: nvidia-smi prints ``00000000:3B:00.0`` (8-digit domain, upper
    case, function), the kernel ``0000:3b:00`` (4-digit domain, lower case, no function)."""
    match = _PCI.fullmatch(bus_id.strip())
    if not match:
        return None
    return f"{int(match[1], 16):04x}:{match[2].lower()}:{match[3].lower()}"


def _bus_key(bus_id: str) -> str | None:
    return pci_key(bus_id)


def parse_smi_minors(text: str) -> dict[str, int]:
    """Device minors from ``nvidia-smi -q`` ("Minor Number" under each ``GPU <bus id>``), keyed by PCI key
    (``pci_key``) and by GPU UUID; GPUs showing N/A (as on Windows) are left out."""
    minors: dict[str, int] = {}
    parts = _Q_GPU.split(text)
    for bus, body in zip(parts[1::2], parts[2::2], strict=True):
        if not (m := _Q_MINOR.search(body)):
            continue
        if key := _bus_key(bus):
            minors[key] = int(m[1])
        if uuid := _Q_UUID.search(body):
            minors[uuid[1]] = int(m[1])
    return minors


def parse_proc_minors(text: str) -> dict[str, int]:
    """Device minors from ``/proc/driver/nvidia/gpus/*/information`` (the files one after another),
    keyed like ``parse_smi_minors``: each file lists "GPU UUID" and "Bus Location" before "Device Minor"."""
    minors: dict[str, int] = {}
    seen: dict[str, str] = {}
    for line in text.splitlines():
        if not (m := _PROC_LINE.match(line.strip())):
            continue
        if m[1] != "Device Minor":
            seen[m[1]] = m[2]
        elif m[2].isdigit():
            if key := _bus_key(seen.get("Bus Location", "")):
                minors[key] = int(m[2])
            if uuid := seen.get("GPU UUID"):
                minors[uuid] = int(m[2])
            seen = {}
    return minors


def with_minors(gpus: list[Gpu], *sources: dict[str, int]) -> list[Gpu]:
    """The GPUs with their device minors, from the first source that knows each by bus id, else UUID.

    Why not the index: ``--query-gpu`` index is nvidia-smi's enumeration (PCI bus order by default),
    while the kernel driver numbers /dev/nvidiaN as it probes the devices, and a VM or container given
    some of a host's GPUs sees the host's minors (a real 4x A100 capture shows indexes 0-3 with minors
    3-6). A GPU no source knows keeps ``minor=None``; the plan refuses it rather than guess.
    """
    out = []
    for g in gpus:
        keys = [k for k in (_bus_key(g.pci_bus_id), g.uuid) if k]
        minor = next((s[k] for s in sources for k in keys if k in s), None)
        out.append(replace(g, minor=minor) if minor is not None else g)
    return out


# --- errors ---------------------------------------------------------------------------------------------
NO_DRIVER = "no_driver"
NO_NVIDIA_SMI = "no_nvidia_smi"  # the driver is loaded (/proc says so) but nvidia-smi is not found
DRIVER_UNREACHABLE = "driver_unreachable"
VERSION_MISMATCH = "version_mismatch"
NO_DEVICES = "no_devices"
OLD_NVIDIA_SMI = "old_nvidia_smi"
UNKNOWN_GPU = "unknown_gpu"
MIG_ENABLED = "mig_enabled"
SMI_FAILED = "nvidia_smi_failed"  # an nvidia-smi failure none of the above explains

_ADVICE = {
    NO_DRIVER: "nvidia-smi is not installed and no NVIDIA driver is loaded{detail}. Install the NVIDIA "
    "driver (`vllm-fleet explain version` lists the minimum each vLLM build needs), or set "
    "`accelerator: cpu`.",
    DRIVER_UNREACHABLE: "nvidia-smi cannot communicate with the NVIDIA kernel driver{detail}: the module is "
    "not loaded or was not built for the running kernel. Check `lsmod | grep nvidia` and `dmesg`, reinstall "
    "the driver (or its DKMS module) for this kernel, then reboot.",
    VERSION_MISMATCH: "NVIDIA driver/library version mismatch{detail}: the user-space driver was upgraded "
    "but the old kernel module is still loaded. Reboot the host, or reload the nvidia kernel module (stop "
    "every GPU process, `rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia`, then `modprobe nvidia`).",
    NO_DEVICES: "the NVIDIA driver is loaded but nvidia-smi found no GPU{detail}. Check `lspci | grep -i "
    "nvidia`, `dmesg | grep NVRM` (RmInitAdapter failures), BIOS settings (Above 4G decoding, Resizable "
    "BAR), and that the GPU is passed through to this machine or container.",
    OLD_NVIDIA_SMI: "nvidia-smi is older than the features fleet queries{detail}; compute capability was "
    "taken from the GPU name. Use the nvidia-smi that ships with the installed driver (a snap or container "
    "can bring an old one).",
    UNKNOWN_GPU: "{detail}.",
    SMI_FAILED: "nvidia-smi failed{detail}. Run `nvidia-smi` on the host to see why.",
    MIG_ENABLED: "MIG mode is enabled{detail}, so the GPU cannot be given to vLLM whole. Disable it with "
    "`nvidia-smi -i <gpu> -mig 0` (then reset the GPU or reboot), or run vLLM on a MIG device explicitly.",
}


def _no_nvidia_smi(driver: str) -> str:
    """The advice when the kernel driver is loaded but its nvidia-smi is missing: which package has it.

    ``driver`` is the version as printed ("550.54.15", or "L4T 35.3.1" for a Jetson). Ubuntu packages the
    tools per driver branch (nvidia-utils-550, or nvidia-utils-550-server for the server driver); Debian
    has one nvidia-smi package.
    """
    head = (f"the NVIDIA driver {driver} is loaded (/proc/driver/nvidia/version) but nvidia-smi is not "
            "installed/not on PATH")
    if driver.startswith("L4T "):
        return (f"{head}: this is a Jetson (L4T), and vLLM's CUDA wheels are built for discrete and server "
                "GPUs, not Jetson; build vLLM from source for Jetson, or set `accelerator: cpu`.")
    branch = driver.split(".", 1)[0]
    return (f"{head}: install the driver's utilities package (nvidia-utils-{branch} on Ubuntu, nvidia-smi "
            f"on Debian) for the loaded driver's version (nvidia-utils-{branch}-server with Ubuntu's server "
            "driver), or put the directory that holds nvidia-smi on the PATH of the deploy login's "
            "non-interactive shell; fleet reads the GPUs through it.")


@dataclass(frozen=True)
class NvidiaProblem:
    """Why a host's GPUs cannot be used as they are, with what to do about it.

    ``detail`` is free text, except for ``no_nvidia_smi``, where it is the loaded driver's version.
    """

    kind: str
    detail: str = ""

    @property
    def blocking(self) -> bool:
        """False for problems the facts already worked around (an old nvidia-smi)."""
        return self.kind != OLD_NVIDIA_SMI

    def message(self, host_name: str) -> str:
        if self.kind == NO_NVIDIA_SMI:
            return f"{host_name}: " + _no_nvidia_smi(self.detail)
        detail = self.detail if self.kind == UNKNOWN_GPU else (f" ({self.detail})" if self.detail else "")
        return f"{host_name}: " + _ADVICE[self.kind].format(detail=detail)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "blocking": self.blocking}


def _mig_detail(indexes: list[int]) -> str:
    return "on GPU " + ", ".join(str(i) for i in indexes)


def _mig_in(text: str) -> list[int]:
    """Indexes of GPUs in MIG mode, from whichever output form the text is; [] when it shows none."""
    try:
        return _mig_indexes(text)
    except ValueError:  # not that form after all, or a GPU it cannot describe: the parsers report those
        return []


def _mig_indexes(text: str) -> list[int]:
    if "NVSMI LOG" in text:
        return [g.index for g in parse_smi_query(text).gpus if g.mig_mode == "Enabled"]
    if _TABLE_HEADER.search(text):
        return [g.index for g in parse_smi_table(text).gpus if g.mig_mode == "Enabled"]
    listed = parse_smi_list(text)
    if listed:
        return [g.index for g in listed if g.mig_devices]
    first = text.lstrip().split("\n", 1)[0]
    if MIG_FIELD in first and "index" in first:
        return [int(r["index"] or -1) for r in parse_query_rows(text) if r.get(MIG_FIELD) == "Enabled"]
    return []


def missing_nvidia_smi(driver: DriverVersion | None, driver_source: str | None) -> NvidiaProblem:
    """The problem of a host where nvidia-smi is not found, given what the driver section read.

    A version from /proc/driver/nvidia/version means the kernel driver is loaded: only the tools are
    missing (a driver installed without its utilities package, or nvidia-smi off PATH), and telling the
    operator to install a driver would be wrong. Otherwise nothing is loaded; a module that ``modinfo``
    finds on disk is named, since it is installed but not loaded.
    """
    if driver is not None and driver_source == "proc":
        return NvidiaProblem(NO_NVIDIA_SMI, str(driver))
    if driver is not None and driver_source == "modinfo":
        return NvidiaProblem(NO_DRIVER, f"kernel module {driver} is on disk (modinfo) but not loaded")
    return NvidiaProblem(NO_DRIVER)


def classify_nvidia_error(text: str) -> NvidiaProblem | None:
    """The problem an nvidia-smi (or shell) output shows, or None when it is ordinary data.

    Recognised: nvidia-smi missing ("command not found"), "couldn't communicate with the NVIDIA driver",
    "Driver/library version mismatch", "No devices were found", a field this nvidia-smi rejects
    ('Field "compute_cap" is not a valid field to query.'), a table whose NVIDIA-SMI version differs from
    the driver's (an old nvidia-smi on a newer driver), and MIG mode enabled in any output form.
    """
    if re.search(r"nvidia-smi: (?:command )?not found|nvidia-smi: No such file or directory", text):
        return NvidiaProblem(NO_DRIVER)
    if "Driver/library version mismatch" in text:
        lib = re.search(r"NVML library version:\s*(\S+)", text)
        return NvidiaProblem(VERSION_MISMATCH, f"NVML library {lib[1]}" if lib else "")
    if "couldn't communicate with the NVIDIA driver" in text:
        module = _MODINFO.search(text)
        return NvidiaProblem(DRIVER_UNREACHABLE, f"kernel module on disk: {module[1]}" if module else "")
    if re.search(r"^\s*No devices were found\s*$", text, re.M):
        return NvidiaProblem(NO_DEVICES)
    if rejected := re.search(r'Field "([^"]+)" is not a valid field to query', text):
        return NvidiaProblem(OLD_NVIDIA_SMI, f"it rejects the query field {rejected[1]}")
    if (header := _TABLE_HEADER.search(text)) and header["smi"] != header["driver"]:
        return NvidiaProblem(OLD_NVIDIA_SMI, f"NVIDIA-SMI {header['smi']} on driver {header['driver']}")
    if mig := _mig_in(text):
        return NvidiaProblem(MIG_ENABLED, _mig_detail(mig))
    return None


def mig_problem(gpus: list[Gpu]) -> NvidiaProblem | None:
    """The MIG problem for GPUs parsed from a query that included ``MIG_FIELD``."""
    enabled = [g.index for g in gpus if g.mig_mode == "Enabled"]
    return NvidiaProblem(MIG_ENABLED, _mig_detail(enabled)) if enabled else None
