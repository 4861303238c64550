"""Read-only facts about a vLLM host, one remote command each.

One combined fact for what every deploy needs (releases, current release, CPU flags, the vllm units
and their systemd state, the state file) keeps a converged host to two remote commands: this and the
file manifest.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from vllm_fleet.core.hostfacts import HostModelFacts, HubCacheFacts, ListenerFacts, VllmHostFacts
from vllm_fleet.core.layout import (
    BASE_DIRS,
    CURRENT_LINK,
    HOST_PYTHON,
    HOST_TOOLS,
    RELEASES_DIR,
    UV_PATH,
    VLLM_USER,
)

# what tells whether a unit is enabled, running, and restarted since it was last read
UNIT_PROPERTIES = ("-p ActiveState -p SubState -p MainPID -p UnitFileState -p ActiveEnterTimestampMonotonic "
                   "-p NRestarts")


# ss -ltnp: "LISTEN 0 4096 127.0.0.1:8000 0.0.0.0:* users:(("vllm",pid=2201,fd=27),...)"
_SS_USER = re.compile(r'\("([^"]*)",pid=(\d+),')
# the last *.service in a cgroup path: "0::/system.slice/vllm-default.service" (v2), or the v1
# "1:name=systemd:/system.slice/ssh.service"; user@1000.service/app.slice/x.service names x.service
_SERVICE = re.compile(r"([^/\s]+\.service)(?=/|\s|$)")


def _listeners(lines: list[str], cgroups: list[str]) -> list[ListenerFacts] | None:
    """TCP listeners from ``ss -ltnp`` with the systemd unit of each socket's first process; None when
    ss printed nothing at all (not installed), so callers can tell "none" from "not read"."""
    if not lines:
        return None
    units: dict[int, str | None] = {}
    for line in cgroups:  # "<pid> <cgroup line>"
        number, _, path = line.partition(" ")
        found = _SERVICE.findall(path)
        if number.isdigit():
            units[int(number)] = found[-1] if found else None
    out: list[ListenerFacts] = []
    for line in lines:
        words = line.split()
        if len(words) < 5 or words[0] != "LISTEN" or ":" not in words[3]:
            continue  # the header, or a line this parser does not know
        address, _, port = words[3].rpartition(":")
        if not port.isdigit():
            continue
        address = address.strip("[]")
        users = _SS_USER.findall(" ".join(words[5:]))
        process, pid = (users[0][0], int(users[0][1])) if users else (None, None)
        out.append({"address": address, "port": int(port), "process": process, "pid": pid,
                    "unit": units.get(pid) if pid is not None else None})
    return out


# Each TCP listener and the cgroup line of its process, as root: ss once, then one line per listening pid.
LISTEN_SH = (
    "echo '## listen'; L=$(ss -ltnp 2>/dev/null); [ -n \"$L\" ] && printf '%s\\n' \"$L\"; "
    "echo '## listen_cgroups'; "
    "for p in $(printf '%s\\n' \"$L\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -un); do "
    "echo \"$p $(grep -E '^0::|name=systemd:' /proc/$p/cgroup 2>/dev/null | head -n1)\"; done; true"
)


def sections_of(output: list[str]) -> dict[str, list[str]]:
    """Lines under each "## name" header of a combined command's output."""
    sections: dict[str, list[str]] = {}
    key = None
    for line in output:
        if line.startswith("## "):
            key = line[3:].strip()
            sections[key] = []
        elif key is not None:
            sections[key].append(line)
    return sections


def listeners_of(sections: dict[str, list[str]]) -> list[ListenerFacts] | None:
    """LISTEN_SH's output as _listeners reads it."""
    return _listeners([ln for ln in sections.get("listen", []) if ln.strip()],
                      sections.get("listen_cgroups", []))


def _int_or_none(lines: list[str]) -> int | None:
    text = "".join(lines).strip()
    return int(text) if text.isdigit() else None


def _base_ok(lines: list[str]) -> bool:
    seen = {path: have for have, path in (line.split(" ", 1) for line in lines if " " in line)}
    return "user-ok" in lines and all(seen.get(path) == want for path, want in BASE_DIRS.items())


MANAGED = "# Managed by vllm-fleet"  # templates/vllm.service.j2's first line


def _created(state: dict[str, Any] | None, managed: list[str]) -> list[str]:
    """The vllm units this toolkit created, the only ones a deploy may remove: as the host state records
    them (hoststate commit, current and previous), else, on a host committed before that record, the
    units that carry the templates' header. A unit someone else put there (vllm-router.service) is
    neither."""
    records = [r for r in ((state or {}).get(k) for k in ("current", "previous")) if isinstance(r, dict)]
    recorded = [r["created"] for r in records if isinstance(r.get("created"), list)]
    if not recorded:
        return sorted(u.strip() for u in managed if u.strip())
    return sorted({f"vllm-{name}.service" for names in recorded for name in names})


# One interpreter for both sections (isolated: root imports nothing from the login's directory): the
# target line, then what a killed run left (hoststate.py LEFTOVERS); without hoststate.py yet, none.
_PYTHON_AND_LEFTOVERS_PY = (
    "import platform, sys; "
    "print('%d.%d' % sys.version_info[:2], platform.machine(), platform.libc_ver()[1] or '-'); "
    f"print('## leftovers', flush=True); sys.path.insert(0, {HOST_TOOLS!r}); import hoststate; "
    "print(*hoststate.leftovers(), sep=chr(10))")


class VllmHost(FactBase[VllmHostFacts]):
    """
    Returns what is installed under /opt/vllm and what was deployed before:

    .. code:: python

        {
            "releases": ["0.31.0-cpu", "0.32.0-cpu"],
            "current": "0.32.0-cpu",
            "cpu_flags": ["avx2", "fma", ...],
            "units": ["vllm-default.service"],
            "unit_states": {"vllm-default.service": {"ActiveState": "active", "MainPID": "1234", ...}},
            "watchdogs": {"vllm-watchdog@default.timer": {"ActiveState": "active",
                                                          "UnitFileState": "enabled"}},
            "base_ok": True,
            "state": {...} or None,
            "uv": "0.13.9",
            "created": ["vllm-default.service"],
            "interfaces": {"10.77.1.2": "host0", ...},
            "unprivileged_port_start": 1024,
            "listeners": [{"address": "127.0.0.1", "port": 8000, "process": "vllm", "pid": 378,
                           "unit": "vllm-default.service"}, ...],
        }

    ``created``: the vllm units this toolkit created (see ``_created``), the only ones a deploy removes
    when their instance leaves the inventory.

    ``unprivileged_port_start`` (None: the kernel has no such sysctl) and ``listeners`` (None: ``ss`` is
    missing) tell vllm_fleet.core.startup whether vLLM can bind its port: the unit runs as user vllm without
    capabilities, and a port another service holds fails the bind.
    """

    def command(self) -> str:
        return (
            f"echo '## releases'; ls -1 {RELEASES_DIR} 2>/dev/null | grep -v '^\\.' ; "
            f"echo '## current'; readlink {CURRENT_LINK} 2>/dev/null; "
            "echo '## cpu'; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2; "
            f"echo '## base'; id -u vllm >/dev/null 2>&1 && echo user-ok; "
            f"stat -c '%U:%G:%a %n' {' '.join(BASE_DIRS)} 2>/dev/null; "
            # every vllm unit with its state, in the same command: a converged host is then one fact
            # and one manifest
            "for u in $(ls -1 /etc/systemd/system/ 2>/dev/null | grep -E '^vllm-[^@]+[.]service$'); do "
            f"echo \"## unit $u\"; systemctl show \"$u\" {UNIT_PROPERTIES} 2>/dev/null; done; "
            # the units that carry the templates' header: what this toolkit created, on a host whose
            # state predates hoststate's record of it
            "echo '## managed'; "
            "for u in $(ls -1 /etc/systemd/system/ 2>/dev/null | grep -E '^vllm-[^@]+[.]service$'); do "
            f"head -n1 \"/etc/systemd/system/$u\" 2>/dev/null | grep -q {shlex.quote('^' + MANAGED)} && "
            "echo \"$u\"; "
            "done; "
            "for t in $(ls -1 /etc/systemd/system/ 2>/dev/null | grep -E '^vllm-watchdog@.+[.]timer$'); do "
            "echo \"## watchdog $t\"; "
            "systemctl show \"$t\" -p ActiveState -p UnitFileState 2>/dev/null; done; "
            "echo '## state'; cat /var/lib/vllm-fleet/state.json 2>/dev/null; "
            f"echo '## uv'; {UV_PATH} --version 2>/dev/null; "
            # what a lock is resolved for (vllm_fleet/core/lock.py Target), and each release's lock
            f"echo '## python'; {HOST_PYTHON} -I -c {shlex.quote(_PYTHON_AND_LEFTOVERS_PY)} 2>/dev/null; "
            f"echo '## locks'; for f in {RELEASES_DIR}/*/.lock; do test -f \"$f\" && "
            "echo \"$(basename \"$(dirname \"$f\")\") $(sha256sum < \"$f\" | cut -c1-16)\"; done; "
            "echo '## addresses'; ip -o addr show 2>/dev/null; "
            # systemd enforces IPAddressAllow= only on the unified cgroup hierarchy (v2)
            "echo '## cgroup2'; test -f /sys/fs/cgroup/cgroup.controllers && echo yes; "
            # what decides whether vLLM can bind its port: the lowest unprivileged port, and each TCP
            # listener with the unit of its process (ss once, then one cgroup line per listening pid)
            "echo '## unprivileged_port_start'; "
            "cat /proc/sys/net/ipv4/ip_unprivileged_port_start 2>/dev/null; "
            + LISTEN_SH
        )

    def process(self, output: list[str]) -> VllmHostFacts:
        sections = sections_of(output)
        units, watchdogs = ({key.split(" ", 1)[1]: dict(line.split("=", 1) for line in lines if "=" in line)
                             for key, lines in sections.items() if key.startswith(kind)}
                            for kind in ("unit ", "watchdog "))
        current = "".join(sections.get("current", [])).strip()
        state_text = "\n".join(sections.get("state", [])).strip()
        interfaces: dict[str, str] = {}
        for line in sections.get("addresses", []):  # "2: host0    inet 10.77.1.2/24 brd ... scope global"
            words = line.split()
            for fam in ("inet", "inet6"):
                if fam in words[2:3] and len(words) > 3:
                    interfaces[words[3].split("/")[0]] = words[1].split("@")[0]
        try:
            state = json.loads(state_text) if state_text else None
        except json.JSONDecodeError:
            state = None
        return {
            "releases": sorted(r.strip() for r in sections.get("releases", []) if r.strip()),
            "current": current.rsplit("/", 1)[-1] if current else None,
            "cpu_flags": " ".join(sections.get("cpu", [])).split(),
            "units": sorted(units),
            # a unit with no file yet is absent: the caller's .get(unit, {}) reads as not enabled, not active
            "unit_states": units,
            # each instance's watchdog timer (vllm-watchdog@<name>.timer) with ActiveState, UnitFileState
            "watchdogs": watchdogs,
            # True when the vllm user and every base directory are as wanted (nothing to do)
            "base_ok": _base_ok(sections.get("base", [])),
            "state": state,
            # "0.13.9" from "uv 0.13.9 (x86_64-unknown-linux-gnu)"; None when uv is absent or does not run
            "uv": next(iter(" ".join(sections.get("uv", [])).split()[1:2]), None),
            "created": _created(state, sections.get("managed", [])),
            # ["3.13", "x86_64", "2.41"]: the host's python3, machine and glibc; [] without python3
            "python": " ".join(sections.get("python", [])).split()[:3],
            # {release: its lock's digest}, for releases built from a lock
            "locks": dict(line.split()[:2] for line in sections.get("locks", []) if len(line.split()) >= 2),
            "interfaces": interfaces,
            "ip_filtering": bool(sections.get("cgroup2")),
            "unprivileged_port_start": _int_or_none(sections.get("unprivileged_port_start", [])),
            "listeners": listeners_of(sections),
            # paths a killed run left behind (hoststate.py LEFTOVERS)
            "leftovers": [p for p in sections.get("leftovers", []) if p.strip()],
        }


_MODEL_INFO_PY = r"""
import glob, json, os, struct, sys
d = sys.argv[1]
out = {"config": None, "weight_bytes": None}
try:
    out["config"] = json.load(open(os.path.join(d, "config.json")))
except Exception:
    pass
files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
if any(not os.path.basename(f).startswith("consolidated") for f in files):
    files = [f for f in files if not os.path.basename(f).startswith("consolidated")]
total = 0
for f in files:
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        head = json.loads(fh.read(n))
    total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in head.items() if k != "__metadata__")
out["weight_bytes"] = total or None
print(json.dumps(out))
"""


class HostModel(FactBase[HostModelFacts]):
    """
    Returns a model directory's config.json and weight size as read on the host (models given by
    host_path), reading only the safetensors headers:

    .. code:: python

        {"config": {"num_attention_heads": 32, ...}, "weight_bytes": 16060522496}
    """

    def command(self, path: str) -> str:
        return f"python3 -c {shlex.quote(_MODEL_INFO_PY)} {shlex.quote(path)} 2>/dev/null || echo '{{}}'"

    def process(self, output: list[str]) -> HostModelFacts:
        try:
            return json.loads("\n".join(output) or "{}")
        except json.JSONDecodeError:
            return {}


_HUB_CACHE_PY = r"""
import json, os, sys
snap, cache = sys.argv[1], sys.argv[2]
present = {}
for root, dirs, files in os.walk(snap):
    for name in files:
        path = os.path.join(root, name)
        try:
            present[os.path.relpath(path, snap)] = os.stat(path).st_size
        except OSError:
            pass
probe = cache
while not os.path.isdir(probe) and probe != "/":
    probe = os.path.dirname(probe)
st = os.statvfs(probe)
print(json.dumps({"present": present, "free": st.f_bavail * st.f_frsize, "fs_path": probe}))
"""


class HubCache(FactBase[HubCacheFacts]):
    """
    Returns what a hub snapshot directory holds on the host (each file's size, links followed as the
    vllm user follows them) and the free space of the cache's file system:

    .. code:: python

        {"present": {"config.json": 612, "model.safetensors": 2164736}, "free": 51539607552,
         "fs_path": "/var/lib/vllm"}

    Read as the vllm user (the cache is its own: root never follows a link it planted); before that user
    exists there is no cache, and only the free space is read.
    """

    def command(self, snapshot: str, cache: str) -> str:
        args = f"-c {shlex.quote(_HUB_CACHE_PY)} {shlex.quote(snapshot)} {shlex.quote(cache)}"
        return (f"if id -u {VLLM_USER} >/dev/null 2>&1; then runuser -u {VLLM_USER} -- python3 {args}; "
                f"else python3 {args}; fi")

    def process(self, output: list[str]) -> HubCacheFacts:
        try:
            found = json.loads("\n".join(output) or "{}")
        except json.JSONDecodeError:
            found = {}
        return {"present": found.get("present") or {}, "free": found.get("free"),
                "fs_path": found.get("fs_path")}
