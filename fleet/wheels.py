"""The controller's wheel cache: downloaded once per release, reused by every host and every later run.

Hosts behind a firewall (the lab's hosts have no route to any registry) install with `--no-index
--find-links` from a bundle of exactly these wheels, which is also how an air-gapped fleet works. The
bundle is one uncompressed tar (wheels are already compressed) named by release, so a host that already
has the release never receives it again.
"""

from __future__ import annotations

import hashlib
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

from fleet.lab import CACHE_DIR

UV_VERSION = "0.13.9"


class WheelCacheError(RuntimeError):
    pass


def wheel_dir(release: str) -> Path:
    return CACHE_DIR / "wheels" / release


def bundle_path(release: str, excludes: Sequence[str] = ()) -> Path:
    """Named by what it holds (release and excluded distributions), so a changed table never reuses a
    bundle built for another exclude list."""
    tag = hashlib.sha256("\n".join(sorted(_norm(e) for e in excludes)).encode()).hexdigest()[:10]
    return CACHE_DIR / "bundles" / f"{release}-{tag}.tar"


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


def _dist_name(wheel: Path) -> str:
    return _norm(wheel.name.split("-")[0])


def bundle(release: str, excludes: Sequence[str] = ()) -> Path:
    """One tar of the wheels a host installs, without the excluded distributions."""
    with _LOCKS.setdefault("bundle:" + release, threading.Lock()):
        return _bundle(release, excludes)


def _bundle(release: str, excludes: Sequence[str]) -> Path:
    out = bundle_path(release, excludes)
    if out.exists():
        return out
    src = wheel_dir(release)
    if not (src / ".complete").exists():
        raise WheelCacheError(f"no complete wheel cache for {release} at {src}")
    skip = {_norm(e) for e in excludes}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for whl in sorted(src.glob("*.whl")):
            if _dist_name(whl) in skip:
                continue
            info = tar.gettarinfo(str(whl), arcname=whl.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(whl, "rb") as f:
                tar.addfile(info, f)
    partial.rename(out)
    return out


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
