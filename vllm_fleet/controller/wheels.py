"""What the controller sends hosts: the wheels of a release's lock (vllm_fleet/controller/locks.py fills
the store), and uv itself.

Hosts behind a firewall (the lab's hosts have no route to any registry) install with `--no-index
--find-links` from wheels the controller sends, which is also how an air-gapped fleet works. Each host
keeps the wheels it was sent in one store at a fixed path (uv's cache is keyed by a wheel's path, so a
fixed path is what lets a later release link the unchanged packages instead of unpacking them again),
and receives only the wheels its store lacks: one uncompressed tar (wheels are already compressed).
"""

from __future__ import annotations

import hashlib
import io
import platform
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


def wheel_dir(name: str) -> Path:
    return CACHE_DIR / "wheels" / name


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


_LOCKS: dict[str, threading.Lock] = {}


def fetch(name: str, requirements: Sequence[str], platform_tag: str | None = None, log=print) -> Path:
    """pip download a controller tool's wheel (uv for the hosts) once, whatever the host count.

    The lock matters under pyinfra, which runs every host's operation at once in gevent greenlets
    (its patched threading.Lock is cooperative there).
    """
    with _LOCKS.setdefault(name, threading.Lock()):
        dest = wheel_dir(name)
        marker = dest / ".complete"
        want = "\n".join(requirements) + "\n"
        if marker.exists() and marker.read_text() == want:
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        log(f"wheel cache: downloading {' '.join(requirements)} into {dest}")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest),
               "--only-binary=:all:", "--retries", "1", "--timeout", "20",
               *(["--platform", platform_tag] if platform_tag else []), *requirements]
        proc = subprocess.run(cmd, text=True, capture_output=True)
        if proc.returncode != 0:
            raise WheelCacheError("pip download failed:\n" + "\n".join(proc.stderr.splitlines()[-15:]))
        marker.write_text(want)
        return dest


def _dist_name(wheel: Path | str) -> str:
    return _norm(Path(wheel).name.split("-")[0])


def parse_store_listing(lines: Sequence[str]) -> dict[str, int]:
    """`NAME SIZE` lines (find -printf '%f %s') -> {wheel file name: size}."""
    have = {}
    for line in lines:
        name, _, size = line.strip().rpartition(" ")
        if name.endswith(".whl") and size.isdigit():
            have[name] = int(size)
    return have


def host_bundle(release: str, lock_text: str, wanted: Sequence[Path],
                have: dict[str, int]) -> tuple[Path, list[Path]]:
    """One tar of what a host lacks for a release: the lock's wheels its store does not hold (a wheel of
    another size, e.g. cut short by a killed upload, counts as missing), plus the release's lock and
    wheel list under `.releases/`. Named by its content, so hosts in the same state share one tar.

    A host that runs 0.31.0 lacks 5 of the 147 wheels of 0.32.0 (0.14 of 0.57 GiB): an upgrade sends
    those and uv links the rest from its cache.
    """
    missing = [w for w in wanted if have.get(w.name) != w.stat().st_size]
    names = "\n".join(w.name for w in wanted) + "\n"
    key = hashlib.sha256("\0".join([release, lock_text, *(f"{w.name}:{w.stat().st_size}" for w in missing)])
                         .encode()).hexdigest()[:12]
    out = CACHE_DIR / "bundles" / f"{release}-{key}.tar"
    with _LOCKS.setdefault("bundle:" + out.name, threading.Lock()):
        if not out.exists():
            _write_tar(out, missing, {f".releases/{release}.wheels": names,
                                      f".releases/{release}.lock": lock_text})
    return out, missing


class Progress(io.RawIOBase):
    """A file being sent, read through: logs bytes, total, rate and elapsed every 3 s, so a 4 GiB
    transfer is never a silent minute in pyinfra's output."""

    def __init__(self, f: io.BufferedReader, total: int, label: str, log, every: float = 3.0) -> None:
        self._f, self._total, self._label, self._log, self._every = f, total, label, log, every
        self._done, self._t0 = 0, time.monotonic()
        self._last = self._t0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._done += len(data)
        now = time.monotonic()
        if now - self._last >= self._every or (not data and self._done and now - self._t0 >= self._every):
            self._last = now
            t = now - self._t0
            pct = 100 * self._done / self._total if self._total else 100
            self._log(f"{self._label}: {self._done / 2**30:.2f} GiB of {self._total / 2**30:.2f} GiB "
                      f"({pct:.0f}%), {self._done / 2**20 / t if t else 0:.0f} MiB/s, {t:.0f} s")
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()


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


def uv_binary(machine: str | None = None, log=print) -> Path:
    """uv for a host of `machine` (the controller's own by default), taken from its PyPI wheel so hosts
    need no route to fetch it."""
    machine = machine or platform.machine()
    out = CACHE_DIR / "uv" / UV_VERSION / machine / "uv"
    if out.exists():
        return out
    name = f"tools-{machine}"
    pattern = f"uv-{UV_VERSION}-*manylinux*{machine}*.whl"
    found = list(wheel_dir(name).glob(pattern))
    if not found:
        fetch(name, [f"uv=={UV_VERSION}"], platform_tag=f"manylinux2014_{machine}", log=log)
        found = list(wheel_dir(name).glob(pattern))
    if not found:
        raise WheelCacheError(f"no uv {UV_VERSION} wheel for {machine} on PyPI")
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as z:
        member = next(n for n in z.namelist() if n.endswith("/scripts/uv"))
        with z.open(member) as f, open(out.with_suffix(".partial"), "wb") as g:
            shutil.copyfileobj(f, g)
    out.with_suffix(".partial").chmod(0o755)
    out.with_suffix(".partial").rename(out)
    return out
