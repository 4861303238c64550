"""pyinfra facts for a host's NVIDIA GPUs and driver: one shell command each, parsed by
``vllm_fleet.core.gpus``.

Why the facts never fail: a host without a driver, with a driver/library mismatch or with no visible GPU is
an answer the plan must explain (with the host's name and what to do), not a pyinfra error that stops the
run. So the command always exits 0, folds stderr into stdout (``2>&1``), frames each part between markers
with its exit status, and ``process`` turns error text into a problem. ``requires_command`` is not used
for the same reason: pyinfra would return the bare default for a host without nvidia-smi, and the plan
could not tell "no driver" from "not looked at".
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from vllm_fleet.core.gpuhealth import HealthReport
from vllm_fleet.core.gpus import (
    MIG_FIELD,
    OLD_NVIDIA_SMI,
    QUERY_FIELDS,
    QUERY_FIELDS_NO_CC,
    SMI_FAILED,
    UNKNOWN_GPU,
    DriverVersion,
    NvidiaOutputError,
    NvidiaProblem,
    UnknownGpuError,
    classify_nvidia_error,
    mig_problem,
    missing_nvidia_smi,
    parse_driver_version,
    parse_proc_minors,
    parse_query_csv,
    parse_smi_minors,
    with_minors,
)
from vllm_fleet.core.hostfacts import NvidiaGpusFacts

MARK = "@@fleet"
# Tried in order until nvidia-smi stops answering 'Field "..." is not a valid field to query.':
# compute_cap needs about R510, mig.mode.current R450; the last form works on any nvidia-smi.
FIELD_SETS = (f"{QUERY_FIELDS},{MIG_FIELD}", f"{QUERY_FIELDS_NO_CC},{MIG_FIELD}", QUERY_FIELDS_NO_CC)
# Kernel log lines kept per read: an Xid storm repeats one line thousands of times, so each (GPU, Xid)
# is kept once, first seen first, and a flood of one harmless Xid cannot push a fatal one out.
XID_LINES = 500
# Device nodes RDMA needs (NCCL's IB/RoCE transport): uverbs*, rdma_cm; a name is kept only if it is a
# plain file name, since it ends up in a unit file.
_DEV_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_FIRST_OF_EACH_XID = ("awk '{k = substr($0, index($0, \"NVRM: Xid\")); sub(/,.*/, \"\", k); "
                      "if (!seen[k]++) print}'")


def _health_sh() -> str:
    """Shell printing the GPU health sections (run only where nvidia-smi exists): the full ``nvidia-smi
    -q`` report, and the kernel's Xid lines since boot from the journal, else dmesg (a journal without
    kernel lines, as in a container or without journal access, is not "no Xid")."""
    return (
        "T=; command -v timeout >/dev/null 2>&1 && T='timeout 120'; "
        f"echo '{MARK} begin health'; $T nvidia-smi -q 2>&1; echo \"{MARK} rc $?\"; "
        f"echo '{MARK} end health'; "
        "if command -v journalctl >/dev/null 2>&1 && "
        "[ -n \"$(journalctl -k -b -n 1 --no-pager -q -o cat 2>/dev/null)\" ]; then src=journal; "
        "x=$(journalctl -k -b --no-pager -q -o cat 2>/dev/null | grep 'NVRM: Xid'); "
        "elif d=$(dmesg 2>/dev/null); then src=dmesg; x=$(printf '%s\\n' \"$d\" | grep 'NVRM: Xid'); "
        "else src=none; x=; fi; "
        f"echo '{MARK} begin xid'; echo \"{MARK} source $src\"; "
        f"printf '%s\\n' \"$x\" | {_FIRST_OF_EACH_XID} | tail -n {XID_LINES}; "
        f"echo '{MARK} end xid'; "
    )


def _minors_sh(proc_gpus_dir: str) -> str:
    """Shell printing the driver's /proc file of each GPU: the fallback for device minors when
    ``nvidia-smi -q`` shows none (a -q that failed or timed out)."""
    return (f"echo '{MARK} begin gpuinfo'; cat {shlex.quote(proc_gpus_dir)}/*/information 2>/dev/null; "
            f"echo '{MARK} end gpuinfo'; ")


def _rdma_sh(dev_dir: str) -> str:
    """Shell listing the RDMA device nodes (none on most hosts: the section is then empty)."""
    return f"echo '{MARK} begin rdma'; ls -1 {shlex.quote(dev_dir)} 2>/dev/null; echo '{MARK} end rdma'; "


def _driver_sh(proc_version_path: str, modinfo_command: str) -> str:
    """Shell printing the driver section: nvidia-smi's answer, else the loaded module's /proc file, else
    ``modinfo nvidia`` (the module on disk: all there is when the module does not load)."""
    proc, modinfo = shlex.quote(proc_version_path), shlex.quote(modinfo_command)
    return (
        "if command -v nvidia-smi >/dev/null 2>&1 && "
        "out=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); then src=nvidia-smi; "
        f"elif out=$(cat {proc} 2>&1); then src=proc; "
        f"elif out=$({modinfo} nvidia 2>&1); then src=modinfo; "
        "else src=none; out=; fi; "
        f"echo '{MARK} begin driver'; echo \"{MARK} source $src\"; printf '%s\\n' \"$out\"; "
        f"echo '{MARK} end driver'"
    )


def _sections(output: list[str]) -> dict[str, list[str]]:
    """{section name: lines} of the framed output; '@@fleet key value' lines inside are kept."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output:
        if line.startswith(f"{MARK} begin "):
            current = sections.setdefault(line.split()[2], [])
        elif line.startswith(f"{MARK} end "):
            current = None
        elif current is not None:
            current.append(line)
    return sections


def _meta(lines: list[str], key: str) -> str | None:
    for line in lines:
        if line.startswith(f"{MARK} {key} "):
            return line.split(" ", 2)[2]
    return None


def _body(lines: list[str]) -> str:
    return "\n".join(line for line in lines if not line.startswith(f"{MARK} "))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else "no output"


def _driver(lines: list[str]) -> tuple[DriverVersion | None, str | None]:
    """The driver section: (version, where it came from), or (None, None) when nothing answered."""
    source, text = _meta(lines, "source"), _body(lines)
    if source in (None, "none") or classify_nvidia_error(text):
        return None, None
    try:
        return parse_driver_version(text), source
    except NvidiaOutputError:
        return None, None


class NvidiaDriver(FactBase[DriverVersion | None]):
    """
    Returns the NVIDIA kernel driver version: from ``nvidia-smi``, else ``/proc/driver/nvidia/version``,
    else ``modinfo nvidia`` (the module on disk, when it does not load); None on hosts without a driver.
    A ``vllm_fleet.core.gpus.DriverVersion``: ordered numerically, printed as reported; ``l4t`` marks a
    Jetson,
    whose NVRM line carries the L4T release instead of a driver branch.

    .. code:: python

        DriverVersion(parts=(550, 54, 15), text="550.54.15", l4t=False)   # prints "550.54.15"
        DriverVersion(parts=(35, 3, 1), text="35.3.1", l4t=True)          # prints "L4T 35.3.1"
        None
    """

    # Class attributes so tests (and unusual hosts) can point them elsewhere.
    proc_version_path = "/proc/driver/nvidia/version"
    modinfo_command = "/sbin/modinfo"

    def command(self) -> str:
        return _driver_sh(self.proc_version_path, self.modinfo_command)

    def process(self, output: list[str]) -> DriverVersion | None:
        return _driver(_sections(output).get("driver", []))[0]


class NvidiaGpus(FactBase[NvidiaGpusFacts]):
    """
    Returns the host's NVIDIA GPUs, its driver version and the problem, if any, that stops them being used.

    Queries ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` with the richest field set
    this nvidia-smi accepts (see ``FIELD_SETS``); compute capability comes from the GPU name when
    ``compute_cap`` is not available. Never fails: what stops the GPUs being used comes back as
    ``problem``, a ``vllm_fleet.core.gpus.NvidiaProblem`` (kinds: no_driver, no_nvidia_smi (the driver is
    loaded but
    nvidia-smi is not found), driver_unreachable, version_mismatch, no_devices, unknown_gpu, mig_enabled,
    nvidia_smi_failed), with ``gpus`` empty unless they could still
    be read; ``notice`` holds what was worked around (old_nvidia_smi) and blocks nothing. Values are
    ``vllm_fleet.core.gpus`` objects; each prints as JSON through ``to_json``.

    ``health`` (a ``vllm_fleet.core.gpuhealth.HealthReport``; None without nvidia-smi) is read in the same
    command,
    to save a round trip: ``nvidia-smi -q`` for ECC errors, retired pages, remapped rows, clock throttling
    and persistence mode, and the kernel's NVRM Xid lines since boot. Read-only, like the rest.

    .. code:: python

        {
            "gpus": [
                Gpu(index=0, uuid="GPU-3fb142e7-7102-c7ac-bd5a-fc829e11ed84", name="NVIDIA A100-PCIE-40GB",
                    memory_mib=40960, compute_capability=(8, 0), pci_bus_id="00000000:12:00.0",
                    mig_mode="Disabled"),
            ],
            "driver": DriverVersion(parts=(555, 42, 2), text="555.42.02", l4t=False),
            "driver_source": "nvidia-smi",
            "fields": "index,uuid,name,memory.total,compute_cap,pci.bus_id,mig.mode.current",
            "problem": None,  # or NvidiaProblem(kind="version_mismatch", detail="NVML library 550.144")
            "notice": None,  # or NvidiaProblem(kind="old_nvidia_smi", ...): worked around
            "health": HealthReport(gpus={"0000:12:00": GpuHealth(...)}, xids={}, xids_read=True),
            "rdma_devices": ("rdma_cm", "uverbs0"),
        }

    Each Gpu carries its device ``minor`` (the N of /dev/nvidiaN, which the unit's DeviceAllow= needs and
    which need not equal the index): from the same ``nvidia-smi -q``, else the driver's
    ``/proc/driver/nvidia/gpus/<bus>/information``; None when neither shows it. ``rdma_devices`` lists
    ``/dev/infiniband`` (read here, not in a fact of its own, to keep one command per host): what a
    cluster node's unit must allow for NCCL to use RDMA instead of TCP.
    """

    proc_version_path = NvidiaDriver.proc_version_path
    modinfo_command = NvidiaDriver.modinfo_command
    proc_gpus_dir = "/proc/driver/nvidia/gpus"
    rdma_dir = "/dev/infiniband"

    @staticmethod
    def default() -> NvidiaGpusFacts:
        return {
            "gpus": [],
            "driver": None,
            "driver_source": None,
            "fields": None,
            "problem": None,
            "notice": None,
            "health": None,
            "rdma_devices": (),
        }

    def command(self) -> str:
        fields = " ".join(f"'{f}'" for f in FIELD_SETS)
        return (
            f"if ! command -v nvidia-smi >/dev/null 2>&1; then echo '{MARK} no-nvidia-smi'; else "
            f"for f in {fields}; do "
            f'out=$(nvidia-smi --query-gpu="$f" --format=csv,noheader,nounits 2>&1); rc=$?; '
            f"case \"$out\" in *'is not a valid field to query'*) continue;; esac; break; done; "
            f"echo '{MARK} begin gpus'; echo \"{MARK} fields $f\"; printf '%s\\n' \"$out\"; "
            f"echo \"{MARK} rc $rc\"; echo '{MARK} end gpus'; "
            + _health_sh()
            + _minors_sh(self.proc_gpus_dir)
            + "fi; "
            + _rdma_sh(self.rdma_dir)
            + _driver_sh(self.proc_version_path, self.modinfo_command)
        )

    def process(self, output: list[str]) -> NvidiaGpusFacts:
        sections = _sections(output)
        result = self.default()
        result["driver"], result["driver_source"] = _driver(sections.get("driver", []))
        result["rdma_devices"] = tuple(sorted(
            n for line in sections.get("rdma", []) if _DEV_NAME.fullmatch(n := line.strip())))
        if f"{MARK} no-nvidia-smi" in output:
            # a loaded driver (read from /proc by the driver section) is not "no driver"
            result["problem"] = missing_nvidia_smi(result["driver"], result["driver_source"])
            return result
        if "health" in sections:
            xid = sections.get("xid", [])
            result["health"] = HealthReport.parse(_body(sections["health"]), _body(xid),
                                                  xids_read=_meta(xid, "source") not in (None, "none"))
        lines = sections.get("gpus", [])
        fields, text, rc = _meta(lines, "fields"), _body(lines), _meta(lines, "rc")
        result["fields"] = fields
        problem = classify_nvidia_error(text)
        if rc != "0" or (problem is not None and problem.blocking):
            result["problem"] = (
                problem if problem and problem.blocking else NvidiaProblem(SMI_FAILED, _first_line(text))
            )
            return result
        try:
            gpus = parse_query_csv(text, fields)
        except UnknownGpuError as error:
            result["problem"] = NvidiaProblem(UNKNOWN_GPU, str(error))
            return result
        except ValueError:  # NvidiaOutputError included: not the data asked for
            result["problem"] = NvidiaProblem(SMI_FAILED, _first_line(text))
            return result
        result["gpus"] = with_minors(gpus, parse_smi_minors(_body(sections.get("health", []))),
                                     parse_proc_minors(_body(sections.get("gpuinfo", []))))
        result["problem"] = mig_problem(gpus)
        if fields and "compute_cap" not in fields:
            result["notice"] = NvidiaProblem(OLD_NVIDIA_SMI, "it rejects the query field compute_cap")
        return result
