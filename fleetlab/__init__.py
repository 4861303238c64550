"""The lab: real Debian hosts with their own systemd, sshd and address, booted on this machine.

Why nspawn and not containers-with-an-engine: the deploy under test manages systemd units, so the hosts
must run systemd as PID 1 and be reached over real SSH, exactly like the fleet's servers. Each host is an
overlayfs over the cached root file system of its Debian suite (built once with debootstrap), in its own
network namespace with a veth pair: 10.77.<i>.1 on the controller side, 10.77.<i>.2 inside.

Everything the lab makes is recorded so `down` can remove it all: processes, mounts, namespaces, veths
and cgroups. `up` is idempotent: a host that already answers SSH is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.controller.paths import (
    CACHE_DIR,  # the product's cache: the lab's root file system and model live there too
)

LAB_DIR = Path(os.environ.get("VLLM_FLEET_LAB", "/var/lib/vllm-fleet/lab"))
SUITE = "bookworm"  # the default suite: what the vLLM, plain and light hosts run
# trixie hosts stand for a fleet's newer servers (Python 3.13, glibc 2.41, systemd 257): stage hosts.
SUITES = ("bookworm", "trixie")
MIRROR = os.environ.get("VLLM_FLEET_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a vLLM host needs from the OS, on top of minbase; lab hosts have no route to a registry, so it is
# all baked into the root file system. Bump ROOTFS_REV when this list changes so caches rebuild.
ROOTFS_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "sudo", "curl",
    "iproute2", "ca-certificates", "libnuma1", "libgomp1", "procps", "haproxy",
]
ROOTFS_REV = 2
HOST_TOOLS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
    "zstd": "zstd",
    "mount": "mount",
}
CGROUP_HIERARCHIES = ("systemd", "unified")
# Lab hosts are reached like a fleet's: host keys recorded when each host is made, and verified.
KNOWN_HOSTS = LAB_DIR / "known_hosts"
SSH_OPTS = [
    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
    "-o", "ConnectTimeout=2", "-o", "LogLevel=ERROR",
]
# The login every lab host has besides root: what a fleet's deploy user gets, passwordless sudo.
DEPLOY_USER = "deploy"
SUDOERS_LINE = f"{DEPLOY_USER} ALL=(root) NOPASSWD: ALL"
# Roles: a vLLM host gets vLLM data in the lab inventory; a plain host (a database, a load balancer)
# sits in the same inventory with none, as in a customer's fleet.
PLAIN_FIRST = 8  # plain hosts count down from lab8, vLLM hosts up from lab1
# Stage hosts (any free index below PLAIN_FIRST the caller picks, e.g. lab5, lab6) get no vLLM data in
# the lab inventory: a test that stages software on another OS release writes its own inventory.
ROLES = ("vllm", "plain", "light", "stage")
LIGHT_FIRST = 20  # light hosts count up from lab20: a fleet's size for the scale bench, no vLLM running


class LabError(RuntimeError):
    """A refusal with a message a person can act on (no traceback)."""


@dataclass(frozen=True)
class LabHost:
    index: int
    role: str = "vllm"  # or "plain", "stage", or "light" (vllm data, never deployed: bench/fleet_scale.py)
    suite: str = SUITE  # the Debian release its root file system is

    @property
    def name(self) -> str:
        return f"lab{self.index}"

    @property
    def address(self) -> str:
        return f"10.77.{self.index}.2"

    @property
    def controller_address(self) -> str:
        return f"10.77.{self.index}.1"

    @property
    def dir(self) -> Path:
        return LAB_DIR / "hosts" / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"


def ssh_key() -> Path:
    return LAB_DIR / "id_ed25519"


def rootfs_tarball(suite: str = SUITE) -> Path:
    return CACHE_DIR / f"lab-rootfs-{suite}-r{ROOTFS_REV}.tar.zst"


def base_dir(suite: str = SUITE) -> Path:
    """The unpacked root of one suite; bookworm keeps the name it had before suites existed, so a lab
    made by an earlier version reuses its base instead of unpacking a second copy."""
    return LAB_DIR / (f"base-r{ROOTFS_REV}" if suite == "bookworm" else f"base-{suite}-r{ROOTFS_REV}")


def _check_suite(suite: str) -> str:
    if suite not in SUITES:
        raise LabError(f"unknown lab suite {suite!r}: the lab builds {', '.join(SUITES)}")
    return suite


def preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab boots systemd-nspawn hosts and needs root: run it as root (sudo)")
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise LabError(
            "missing tools for the lab; install them with:\n"
            f"  apt-get install -y {' '.join(missing)}"
        )


def _run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


def build_rootfs(log=print, suite: str = SUITE) -> Path:
    """Debootstrap once, keep a zstd tarball: later labs unpack it in seconds instead of minutes."""
    tarball = rootfs_tarball(_check_suite(suite))
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-build-") as tmp:
        root = Path(tmp) / "root"
        log(f"building the lab root file system ({suite}, debootstrap; takes 1-2 minutes, once)")
        t0 = time.monotonic()
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}", suite,
             str(root), MIRROR],
            text=True, capture_output=True,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise LabError(f"debootstrap failed:\n{tail}")
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        (root / "etc/machine-id").write_text("")
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()  # each host gets its own
        # haproxy is there for the hosts a test makes load balancers; it runs only where deployed
        (root / "etc/systemd/system/multi-user.target.wants/haproxy.service").unlink(missing_ok=True)
        # No DNS is reachable from a host's namespace: fail lookups fast instead of 10-20 s timeouts.
        resolv = root / "etc/resolv.conf"
        if resolv.is_symlink() or resolv.exists():
            resolv.unlink()
        resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        partial = tarball.with_name(tarball.name + ".partial")
        subprocess.run(
            f"tar -C {root} -cf - . | zstd -q -T0 -3 -o {partial}", shell=True, check=True
        )
        partial.rename(tarball)
        log(f"root file system cached at {tarball} ({time.monotonic() - t0:.0f} s)")
    return tarball


def _base_dir(suite: str = SUITE) -> Path:
    """The unpacked, read-only lower layer shared by every host's overlay of one suite."""
    base = base_dir(suite)
    if (base / ".complete").exists():
        return base
    tarball = build_rootfs(suite=suite)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    subprocess.run(f"zstd -q -dc {tarball} | tar -C {base} -xf -", shell=True, check=True)
    (base / ".complete").write_text("")
    return base


def _ensure_key() -> Path:
    key = ssh_key()
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-fleet-lab", "-f", str(key)])
    return key


def ssh(host: LabHost, command: str, timeout: float = 30, user: str = "root",
        stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run a command on a lab host (used by the lab itself and by tests that inspect hosts)."""
    return subprocess.run(
        ["ssh", "-i", str(ssh_key()), *SSH_OPTS, f"{user}@{host.address}", command],
        text=True, capture_output=True, timeout=timeout, input=stdin,
    )


def _answers(host: LabHost) -> bool:
    try:
        return ssh(host, "true", timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _alive(pid: int) -> bool:
    """Whether `pid` still runs. A process this one started (nspawn booted by a test's fixture) stays a
    zombie until reaped, and a zombie answers kill(pid, 0): reaping it here is what lets a stop or a halt
    see it gone, instead of waiting out its timeout and taking a halted host for a half-alive one."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _nspawn_pid(host: LabHost) -> int | None:
    pidfile = host.dir / "nspawn.pid"
    if not pidfile.exists():
        return None
    pid = int(pidfile.read_text())
    return pid if _alive(pid) else None


def _prepare_root(host: LabHost, base: Path, pubkey: str) -> None:
    d = host.dir
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    if _run(["mountpoint", "-q", str(host.root)], check=False).returncode != 0:
        _run(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir={base},upperdir={d / 'upper'},workdir={d / 'work'}", str(host.root)])
    r = host.root
    if not (r / "etc/machine-id").read_text().strip():
        (r / "etc/machine-id").write_text(_run(["systemd-id128", "new"]).stdout)
    (r / "etc/hostname").write_text(host.name + "\n")
    (r / "etc/hosts").write_text(
        f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n{host.controller_address} controller\n"
    )
    if not list((r / "etc/ssh").glob("ssh_host_*")):
        _run(["ssh-keygen", "-A", "-f", str(r)])
    ssh_dir = r / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    (ssh_dir / "authorized_keys").chmod(0o600)
    _deploy_user(r, pubkey)


def _deploy_user(r: Path, pubkey: str) -> None:
    """The fleet's login: an ordinary user with the lab key and passwordless sudo, made inside the
    host's own root (its useradd, its /etc), so it is what `adduser` makes on a real server."""
    if f"\n{DEPLOY_USER}:" not in "\n" + (r / "etc/passwd").read_text():
        _run(["chroot", str(r), "useradd", "--create-home", "--shell", "/bin/bash", DEPLOY_USER])
    home = r / "home" / DEPLOY_USER
    ids = (r / "etc/passwd").read_text().split(f"\n{DEPLOY_USER}:", 1)[1].split(":")
    uid, gid = int(ids[1]), int(ids[2])
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    (ssh_dir / "authorized_keys").chmod(0o600)
    for p in (ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(p, uid, gid)
    sudoers = r / "etc/sudoers.d/vllm-fleet"
    sudoers.write_text(SUDOERS_LINE + "\n")
    sudoers.chmod(0o440)


def write_known_hosts() -> None:
    """Every made host's public host keys, by address: what an operator's known_hosts holds for a fleet
    (a host made again gets new keys, and its line here changes with them)."""
    lines = []
    hosts_dir = LAB_DIR / "hosts"
    for d in sorted(hosts_dir.iterdir()) if hosts_dir.exists() else []:
        h = LabHost(int(d.name.removeprefix("lab")))
        for pub in sorted((h.root / "etc/ssh").glob("ssh_host_*_key.pub")):
            kind, key = pub.read_text().split()[:2]
            lines.append(f"{h.address} {kind} {key}")
    tmp = KNOWN_HOSTS.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.replace(KNOWN_HOSTS)


def _network(host: LabHost) -> None:
    ns = host.name
    if ns not in _run(["ip", "netns", "list"]).stdout.split():
        _run(["ip", "netns", "add", ns])
    veth = f"ve-{ns}"
    if _run(["ip", "link", "show", veth], check=False).returncode != 0:
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", ns])
        _run(["ip", "addr", "add", f"{host.controller_address}/24", "dev", veth])
        _run(["ip", "link", "set", veth, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "host0"])
        _run(["ip", "-n", ns, "link", "set", "host0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "route", "add", "default", "via", host.controller_address])
    # Lab hosts reach each other through the controller, as the nodes of a cluster must.
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")


def nspawn_env(suite: str) -> dict[str, str]:
    """trixie hosts get a cgroup v2 (unified) tree of their own, as trixie servers have: on this
    machine's hybrid cgroups nspawn would otherwise hand systemd 257 the v1 hierarchies, which it boots
    on only as deprecated ("tainted: cgroupsv1") and its successors refuse. bookworm hosts keep the
    hybrid setup they were measured with."""
    return {} if suite == "bookworm" else {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def _boot(host: LabHost) -> None:
    """Start nspawn in a cgroup of its own: containers sharing one break each other's services."""
    cg = " ".join(f"/sys/fs/cgroup/{h}/vllm-fleet-lab/{host.name}" for h in CGROUP_HIERARCHIES)
    script = (
        f"for c in {cg}; do mkdir -p $c && echo $$ > $c/cgroup.procs; done; "
        f"exec systemd-nspawn -b -D {host.root} -M {host.name} --register=no --keep-unit "
        f"--console=passive --resolv-conf=off --network-namespace-path=/run/netns/{host.name}"
    )
    # a trixie host's unified tree: nspawn copies this same path into the cgroup2 hierarchy it mounts
    log = open(host.dir / "nspawn.log", "w")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **nspawn_env(host.suite)})
    (host.dir / "nspawn.pid").write_text(str(proc.pid))


def _wait_running(host: LabHost, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            out = ssh(host, "systemctl is-system-running --wait", timeout=30)
            if out.returncode == 0 or out.stdout.strip() in ("running", "degraded"):
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.3)
    log = (host.dir / "nspawn.log").read_text(errors="replace").splitlines()[-10:]
    raise LabError(f"{host.name} did not boot within {timeout:.0f} s; nspawn log:\n" + "\n".join(log))


def write_state(hosts: list[LabHost]) -> None:
    state = {"key": str(ssh_key()), "known_hosts": str(KNOWN_HOSTS),
             "hosts": [{"name": h.name, "address": h.address, "role": h.role, "suite": h.suite}
                       for h in hosts]}
    (LAB_DIR / "hosts.json").write_text(json.dumps(state, indent=2) + "\n")


def read_state() -> list[LabHost]:
    path = LAB_DIR / "hosts.json"
    if not path.exists():
        return []
    return [LabHost(int(h["name"].removeprefix("lab")), h.get("role", "vllm"), h.get("suite", SUITE))
            for h in json.loads(path.read_text())["hosts"]]


def up(count: int, plain: int = 0, log=print) -> list[LabHost]:
    """Boot vLLM hosts lab1..lab<count> and `plain` hosts without vLLM (lab8 down); idempotent."""
    preflight()
    if count < 1 or plain < 0 or count + plain > PLAIN_FIRST:
        raise LabError(f"the lab runs 1 to {PLAIN_FIRST} hosts in all (each vLLM needs ~2.5 GiB)")
    t0 = time.monotonic()
    hosts = [LabHost(i) for i in range(1, count + 1)]
    hosts += [LabHost(PLAIN_FIRST - i, "plain") for i in range(plain)]
    return _up(hosts, t0, log)


def up_light(count: int, log=print) -> list[LabHost]:
    """Boot `count` light hosts (lab20 up): vLLM hosts in the inventory that are only planned, never
    deployed (`pyinfra --dry`), so a fleet's size fits on this machine; idempotent."""
    preflight()
    if not 1 <= count <= 200:
        raise LabError("the lab runs 1 to 200 light hosts")
    return _up([LabHost(LIGHT_FIRST + i, "light") for i in range(count)], time.monotonic(), log)


def up_stage(indexes: list[int], suite: str = "trixie", log=print) -> list[LabHost]:
    """Boot stage hosts lab<i> for each index, on `suite`: hosts in the lab but not in its vLLM
    inventory, for tests that bring software to another Debian release; idempotent, keeps the others.

    A host already up at one of the indexes as another role or suite is a refusal (see _clashes)."""
    preflight()
    _check_suite(suite)
    if not indexes or any(not 1 <= i < PLAIN_FIRST for i in indexes):
        raise LabError(f"stage hosts take indexes 1 to {PLAIN_FIRST - 1}, apart from the vLLM hosts")
    return _up([LabHost(i, "stage", suite) for i in sorted(set(indexes))], time.monotonic(), log)


def _clashes(wanted: list[LabHost], running: list[LabHost]) -> list[LabHost]:
    """Running hosts that `up` would otherwise take for wanted ones at the same index: one on another
    suite, or a stage host taken for a vLLM one or the reverse. Its disk is another test's state, and
    a host that answers SSH is never rebuilt, so the only safe answer is a refusal. (A plain host
    asked for as a vLLM one is left to the earlier rule: relabelled, as before suites.)"""
    by_index = {h.index: h for h in running}
    clash = []
    for w in wanted:
        r = by_index.get(w.index)
        if r and (r.suite != w.suite or (r.role == "stage") != (w.role == "stage")):
            clash.append(r)
    return clash


def _up(hosts: list[LabHost], t0: float, log) -> list[LabHost]:
    clash = _clashes(hosts, [h for h in read_state() if _nspawn_pid(h)])
    if clash:
        busy = ", ".join(f"{h.name} ({h.role}, {h.suite})" for h in clash)
        raise LabError(f"already up as other hosts: {busy}; remove them first (fleetlab.remove)")
    bases = {suite: _base_dir(suite) for suite in sorted({h.suite for h in hosts})}
    pubkey = _ensure_key().with_suffix(".pub").read_text()
    write_known_hosts()  # hosts an earlier `up` made answer with the keys they have
    booting = []
    for h in hosts:
        if _nspawn_pid(h) and _answers(h):
            continue
        if _nspawn_pid(h):  # half-alive: start over for this host
            stop(h)
        _prepare_root(h, bases[h.suite], pubkey)
        _network(h)
        booting.append(h)
    write_known_hosts()
    for h in booting:
        _boot(h)
    for h in booting:
        _wait_running(h)
        note = {"plain": " (plain host, no vLLM)", "stage": f" (stage host, {h.suite})"}.get(h.role, "")
        log(f"{h.name} up at {h.address}{note}")
    # keep hosts that an earlier `up` started: `up` never destroys
    wanted = {h.index for h in hosts}
    extra = [h for h in read_state() if h.index not in wanted and _nspawn_pid(h)]
    write_state(sorted(hosts + extra, key=lambda h: h.index))
    log(f"lab: {summary(hosts + extra)} ready in {time.monotonic() - t0:.1f} s")
    return sorted(hosts + extra, key=lambda h: h.index)


def summary(hosts: list[LabHost]) -> str:
    """'2 vLLM host(s) and 1 stage host(s)': vLLM hosts always named, other roles only when present."""
    counts = {role: sum(h.role == role for h in hosts) for role in ROLES}
    parts = [f"{counts['vllm']} vLLM host(s)"] + [f"{n} {role} host(s)" for role, n in counts.items()
                                                  if role != "vllm" and n]
    return " and ".join(parts)


def remove(host: LabHost) -> None:
    """Stop a host and take it out of the lab's state (the inventory no longer lists it)."""
    stop(host)
    write_state([h for h in read_state() if h.index != host.index])


def terminate(pid: int, group: bool = False) -> None:
    """SIGTERM, up to 10 s for it to end, then SIGKILL (to its whole process group with `group`)."""
    os.kill(pid, 15)
    for _ in range(100):
        if not _alive(pid):
            return
        time.sleep(0.1)
    if group:
        os.killpg(pid, 9)
    else:
        os.kill(pid, 9)


def stop(host: LabHost) -> None:
    """Remove everything `up` made for one host; safe to call on a half-made host."""
    pid = _nspawn_pid(host)
    if pid:
        terminate(pid)
    # nspawn leaves no stragglers normally; kill any left in the host's cgroups before removing them
    for hier in CGROUP_HIERARCHIES:
        cg = Path(f"/sys/fs/cgroup/{hier}/vllm-fleet-lab/{host.name}")
        if cg.exists():
            for procs in cg.rglob("cgroup.procs"):
                for p in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(p), 9)
            time.sleep(0.2)
            for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                d.rmdir()
            cg.rmdir()
    _run(["ip", "link", "del", f"ve-{host.name}"], check=False)
    _run(["ip", "netns", "del", host.name], check=False)
    if host.root.exists() and _run(["mountpoint", "-q", str(host.root)], check=False).returncode == 0:
        _run(["umount", str(host.root)], check=False)
        if _run(["mountpoint", "-q", str(host.root)], check=False).returncode == 0:
            _run(["umount", "-l", str(host.root)])
    shutil.rmtree(host.dir, ignore_errors=True)
    write_known_hosts()


def halt(host: LabHost) -> None:
    """Stop a host's processes but keep its disk: the 'unreachable host' of failure tests."""
    pid = _nspawn_pid(host)
    if pid:
        os.kill(pid, 15)
        for _ in range(100):
            if _nspawn_pid(host) is None:
                break
            time.sleep(0.1)


def power_cut(host: LabHost) -> None:
    """Every process of the host killed at once, as a power cut would: no unit stops, no shutdown.
    (Unlike real power loss, writes the kernel had not flushed yet survive: the disk is this machine's.)"""
    for _ in range(3):  # a process forking while it is being killed lands in the cgroup again
        for hier in CGROUP_HIERARCHIES:
            cg = Path(f"/sys/fs/cgroup/{hier}/vllm-fleet-lab/{host.name}")
            for procs in cg.rglob("cgroup.procs") if cg.exists() else ():
                for p in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(p), 9)
        time.sleep(0.3)
    pid = _nspawn_pid(host)
    if pid:
        terminate(pid)


def power_on(host: LabHost, log=print) -> None:
    """Boot a host that was cut or halted again from its disk, in its role and suite."""
    known = [h for h in read_state() if h.index == host.index]
    if not known:
        raise LabError(f"{host.name} is not a lab host")
    _up(known, time.monotonic(), log)


def down(log=print) -> None:
    preflight()
    hosts_dir = LAB_DIR / "hosts"
    names = sorted(p.name for p in hosts_dir.iterdir()) if hosts_dir.exists() else []
    for name in names:
        stop(LabHost(int(name.removeprefix("lab"))))
        log(f"{name} removed")
    for hier in CGROUP_HIERARCHIES:
        top = Path(f"/sys/fs/cgroup/{hier}/vllm-fleet-lab")
        if top.exists():
            with contextlib.suppress(OSError):
                top.rmdir()
    state = LAB_DIR / "hosts.json"
    if state.exists():
        state.unlink()
    log("lab: down")
