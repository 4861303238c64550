"""The controller's wheel cache: downloaded once per release, reused by every host and every later run.

Hosts behind a firewall (the lab's hosts have no route to any registry) install with `--no-index
--find-links` from wheels the controller sends, which is also how an air-gapped fleet works. Each host
keeps the wheels it was sent in one store at a fixed path (uv's cache is keyed by a wheel's path, so a
fixed path is what lets a later release link the unchanged packages instead of unpacking them again),
and receives only the wheels its store lacks: one uncompressed tar (wheels are already compressed).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from vllm_fleet.controller.paths import CACHE_DIR

UV_VERSION = "0.13.9"


class WheelCacheError(RuntimeError):
    pass


def wheel_dir(release: str) -> Path:
    return CACHE_DIR / "wheels" / release


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _extra_sources() -> list[str]:
    """Fleet-wide wheel sources, e.g. a find-links folder holding torch's CPU build, or a mirror."""
    args = ["--retries", "1", "--timeout", "20"]  # an unreachable index costs seconds, not minutes
    for fl in filter(None, os.environ.get("VLLM_FLEET_FIND_LINKS", "").split(",")):
        args += ["--find-links", fl]
    for idx in filter(None, os.environ.get("VLLM_FLEET_EXTRA_INDEX_URLS", "").split(",")):
        args += ["--extra-index-url", idx]
    return args


_LOCKS: dict[str, threading.Lock] = {}


def fetch(release: str, requirements: Sequence[str], index_args: Sequence[str] = (), log=print) -> Path:
    """pip download the release's requirements (and their dependencies) once, whatever the host count.

    The lock matters under pyinfra, which runs every host's operation at once in gevent greenlets
    (its patched threading.Lock is cooperative there).
    """
    with _LOCKS.setdefault(release, threading.Lock()):
        return _fetch(release, requirements, index_args, log)


def _fetch(release: str, requirements: Sequence[str], index_args: Sequence[str], log) -> Path:
    dest = wheel_dir(release)
    marker = dest / ".complete"
    want = "\n".join(requirements) + "\n"
    if marker.exists() and marker.read_text() == want:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    log(f"wheel cache: downloading {' '.join(requirements)} into {dest} (once per release)")
    t0 = time.monotonic()
    if os.environ.get("VLLM_FLEET_VARIANT_INDEXES", "1") == "0":
        # this controller's own pip configuration already holds the variant's wheels (a mirror, or a
        # find-links folder with torch's CPU build, as on the lab's machines): skip the public indexes
        index_args = []
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest),
           "--only-binary=:all:", *index_args, *_extra_sources(), *requirements]
    proc = subprocess.run(cmd, text=True, capture_output=True)
    if proc.returncode != 0:
        raise WheelCacheError("pip download failed:\n" + "\n".join(proc.stderr.splitlines()[-15:]))
    marker.write_text(want)
    log(f"wheel cache: {sum(1 for _ in dest.glob('*.whl'))} wheels in {time.monotonic() - t0:.0f} s")
    return dest


def _dist_name(wheel: Path | str) -> str:
    return _norm(Path(wheel).name.split("-")[0])


def release_wheels(release: str, excludes: Sequence[str] = ()) -> list[Path]:
    """The wheels a host installs for a release: the controller's download without the excluded ones."""
    src = wheel_dir(release)
    if not (src / ".complete").exists():
        raise WheelCacheError(f"no complete wheel cache for {release} at {src}")
    skip = {_norm(e) for e in excludes}
    return [w for w in sorted(src.glob("*.whl")) if _dist_name(w) not in skip]


def constraints(wheels: Sequence[Path | str]) -> list[str]:
    """`name==version` for each wheel: pins the host's resolver to exactly what was downloaded for this
    release, although the host's wheel store also holds other releases' versions."""
    return [f"{_dist_name(w)}=={Path(w).name.split('-')[1]}" for w in wheels]


def parse_store_listing(lines: Sequence[str]) -> dict[str, int]:
    """`NAME SIZE` lines (find -printf '%f %s') -> {wheel file name: size}."""
    have = {}
    for line in lines:
        name, _, size = line.strip().rpartition(" ")
        if name.endswith(".whl") and size.isdigit():
            have[name] = int(size)
    return have


def host_bundle(release: str, excludes: Sequence[str], have: dict[str, int]) -> tuple[Path, list[Path]]:
    """One tar of what a host lacks for a release: the wheels its store does not hold (a wheel of another
    size, e.g. cut short by a killed upload, counts as missing), plus the release's wheel list and
    constraints under `.releases/`. Named by its content, so hosts in the same state share one tar.

    A host that runs 0.31.0 lacks 5 of the 147 wheels of 0.32.0 (0.14 of 0.57 GiB): an upgrade sends
    those and uv links the rest from its cache.
    """
    wanted = release_wheels(release, excludes)
    missing = [w for w in wanted if have.get(w.name) != w.stat().st_size]
    names = "\n".join(w.name for w in wanted) + "\n"
    pins = "\n".join(constraints(wanted)) + "\n"
    key = hashlib.sha256("\0".join([release, names, *(f"{w.name}:{w.stat().st_size}" for w in missing)])
                         .encode()).hexdigest()[:12]
    out = CACHE_DIR / "bundles" / f"{release}-{key}.tar"
    with _LOCKS.setdefault("bundle:" + out.name, threading.Lock()):
        if not out.exists():
            _write_tar(out, missing, {f".releases/{release}.wheels": names,
                                      f".releases/{release}.constraints": pins})
    return out, missing


def _write_tar(out: Path, wheels: Sequence[Path], extra: dict[str, str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for whl in wheels:
            info = tar.gettarinfo(str(whl), arcname=whl.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(whl, "rb") as f:
                tar.addfile(info, f)
        for name, text in extra.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.rename(out)


def uv_binary(log=print) -> Path:
    """uv for the hosts, taken from its PyPI wheel so hosts need no route to fetch it."""
    out = CACHE_DIR / "uv" / UV_VERSION / "uv"
    if out.exists():
        return out
    src = CACHE_DIR / "wheels" / "tools"
    wheels = list(src.glob(f"uv-{UV_VERSION}-*manylinux*x86_64*.whl"))
    if not wheels:
        fetch("tools", [f"uv=={UV_VERSION}"], log=log)
        wheels = list(src.glob(f"uv-{UV_VERSION}-*manylinux*x86_64*.whl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z:
        member = next(n for n in z.namelist() if n.endswith("/scripts/uv"))
        with z.open(member) as f, open(out.with_suffix(".partial"), "wb") as g:
            shutil.copyfileobj(f, g)
    out.with_suffix(".partial").chmod(0o755)
    out.with_suffix(".partial").rename(out)
    return out
