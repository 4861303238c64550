"""Resolve a release's lock for a target, once, and fill the controller's store with exactly its files.

A lock is resolved with uv for the target's Python and platform (not the controller's), kept under the
cache directory and reused by every later run: a rerun, a second host of the same target and a rollback
install the same files, whatever the index has published since. The store holds wheels by file name, for
every lock; a file is kept only after its sha256 matched the lock.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import httpx

from vllm_fleet.controller.paths import CACHE_DIR
from vllm_fleet.core.lock import (
    IndexSettings,
    Lock,
    LockError,
    Pin,
    Target,
    best_file,
    broken_pairs,
    digest,
    normalize,
)

# VLLM_FLEET_LOCKS: a folder in the operator's repository, so that every controller (a laptop, CI)
# installs the locks the repository holds, reviewed and versioned like the inventory
LOCKS_DIR = Path(os.environ.get("VLLM_FLEET_LOCKS") or CACHE_DIR / "locks")
STORE = CACHE_DIR / "wheels" / "files"
_GUARDS: dict[str, threading.Lock] = {}
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def _guard(key: str) -> threading.Lock:
    return _GUARDS.setdefault(key, threading.Lock())


def lock_path(requirement: str, target: Target, settings: IndexSettings,
              constraints: Sequence[str] = ()) -> Path:
    """Named by everything the resolution depends on: a changed constraint or index is a new lock."""
    safe = re.sub(r"[^A-Za-z0-9.=+-]", "_", requirement)
    cons = digest("\n".join(sorted(constraints)))[:8]
    return LOCKS_DIR / f"{safe}-{target.key}-{settings.key}-{cons}.txt"


def resolve(requirement: str, target: Target, settings: IndexSettings, constraints: Sequence[str] = (),
            excludes: Sequence[str] = (), accelerator: str = "cuda", uv: Path | None = None,
            log: Callable[[str], None] = print) -> Lock:
    """The lock for `requirement` on `target`: resolved once (uv pip compile for the target's Python
    and platform, every file's hash), checked for known broken pairs, then read from the cache."""
    path = lock_path(requirement, target, settings, constraints)
    with _guard(str(path)):
        if path.exists():
            return _checked(Lock.parse(path.read_text()), path, accelerator).without(excludes)
        from vllm_fleet.controller.wheels import uv_binary

        uv = uv or uv_binary(log=log)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="lock-", dir=path.parent) as tmp:
            cons = Path(tmp) / "constraints.txt"
            cons.write_text("".join(f"{c}\n" for c in constraints))
            out = Path(tmp) / "lock.txt"
            cmd = [str(uv), "pip", "compile", "-", "--quiet", "--python-version",
                   f"{target.python[0]}.{target.python[1]}", "--python-platform", target.platform,
                   "--generate-hashes", "--no-header", "--no-annotate", "--only-binary", ":all:",
                   "--constraint", str(cons), "--output-file", str(out), *settings.uv_args()]
            t0 = time.monotonic()
            log(f"lock: resolving {requirement} for {target.key} from {settings.describe()}")
            proc = subprocess.run(cmd, input=requirement + "\n", text=True, capture_output=True,
                                  env={**os.environ, "UV_CACHE_DIR": str(CACHE_DIR / "uv-cache")})
            if proc.returncode != 0:
                tail = " ".join(proc.stderr.split())[-600:]
                raise LockError(f"resolving {requirement} for {target.key} failed: {tail}")
            lock = Lock.parse(out.read_text())
            _checked(lock, path, accelerator)  # a broken resolution is never cached
            out.replace(path)
        log(f"lock: {len(lock.pins)} packages, {lock.digest}, in {time.monotonic() - t0:.0f} s ({path})")
        return lock.without(excludes)


def _checked(lock: Lock, path: Path, accelerator: str) -> Lock:
    problems = broken_pairs(lock, accelerator=accelerator)
    if problems:
        raise LockError(f"the lock {path.name} pairs packages that break each other: " + "; ".join(problems))
    return lock


# --- the store ----------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _Links(HTMLParser):
    """A PEP 503 page's anchors (file name -> href)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links[data.strip()] = self._href
            self._href = None


def index_files(client: httpx.Client, index: str, name: str) -> dict[str, tuple[str, str]]:
    """{file name: (url, sha256)} of one project on a PEP 503 / PEP 691 index."""
    base = index.rstrip("/") + f"/{name}/"
    r = client.get(base, headers={"Accept": f"{_SIMPLE_JSON}, text/html;q=0.1"}, follow_redirects=True)
    if r.status_code == 404:
        return {}
    r.raise_for_status()
    files: dict[str, tuple[str, str]] = {}
    if r.headers.get("content-type", "").startswith(_SIMPLE_JSON):
        for f in r.json().get("files", []):
            sha = (f.get("hashes") or {}).get("sha256")
            if sha:
                files[f["filename"]] = (urljoin(str(r.url), f["url"]), sha)
        return files
    parser = _Links()
    parser.feed(r.text)
    for fname, href in parser.links.items():
        url, frag = urldefrag(urljoin(str(r.url), href))
        if frag.startswith("sha256="):
            files[fname] = (url, frag.removeprefix("sha256="))
    return files


def _local_files(find_links: Sequence[str]) -> dict[str, Path]:
    """Wheels in the controller's find-links folders (a site's own builds, torch's CPU build)."""
    found: dict[str, Path] = {}
    for d in find_links:
        folder = Path(d).expanduser().resolve()
        for p in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
            found.setdefault(p.name, p)
    return found


def fill_store(lock: Lock, target: Target, settings: IndexSettings,
               log: Callable[[str], None] = print) -> list[Path]:
    """The lock's wheels for the target in the store, downloading what is missing; a file whose sha256
    does not match the lock is never kept. Once per lock, whatever the host count."""
    with _guard(f"store:{lock.digest}:{target.key}"):
        return _fill(lock, target, settings, log)


def _fill(lock: Lock, target: Target, settings: IndexSettings, log: Callable[[str], None]) -> list[Path]:
    STORE.mkdir(parents=True, exist_ok=True)
    stored = _by_project(p.name for p in STORE.glob("*.whl"))
    local = _by_project(_local_files(settings.find_links))
    local_paths = _local_files(settings.find_links)
    wanted: dict[str, Path] = {}
    todo: list[tuple[Pin, str, str]] = []  # pin, file name, url
    problems = []
    with httpx.Client(timeout=60) as client:
        for pin in lock.pins:
            mine = [n for n in stored.get(pin.name, ()) if n.split("-")[1] == pin.version]
            name = best_file({n: _sha_of_store(STORE / n) for n in mine}, pin, target)
            if name:
                wanted[pin.name] = STORE / name
                continue
            candidates = {n: (str(local_paths[n]), _sha256(local_paths[n]))
                          for n in local.get(pin.name, ()) if n.split("-")[1] == pin.version}
            if not best_file({n: s for n, (_, s) in candidates.items()}, pin, target):
                for index in settings.indexes:
                    candidates.update(index_files(client, index, pin.name))
            name = best_file({n: s for n, (_, s) in candidates.items()}, pin, target)
            if name is None:
                problems.append(f"{pin.name}=={pin.version}: no wheel for {target.key} "
                                "with a hash in the lock")
                continue
            wanted[pin.name] = STORE / name
            todo.append((pin, name, candidates[name][0]))
    if problems:
        raise LockError("the store cannot hold the lock: " + "; ".join(problems[:5]))
    if todo:
        _download(todo, log)
    return [wanted[p.name] for p in lock.pins]


def _by_project(names) -> dict[str, list[str]]:
    """Wheel file names by normalized project name (a wheel's first field, `_` for `-`)."""
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(normalize(n.split("-")[0]), []).append(n)
    return out


_SHA_MEMO: dict[tuple[str, int, float], str] = {}


def _sha_of_store(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime)
    if key not in _SHA_MEMO:
        side = path.with_name(path.name + ".sha256")
        if side.exists() and side.stat().st_mtime >= st.st_mtime:
            _SHA_MEMO[key] = side.read_text().strip()
        else:
            _SHA_MEMO[key] = _sha256(path)
            side.write_text(_SHA_MEMO[key] + "\n")
    return _SHA_MEMO[key]


def _download(todo: list[tuple[Pin, str, str]], log: Callable[[str], None]) -> None:
    t0, done, lock = time.monotonic(), [0, 0], threading.Lock()
    last = [t0]
    total_files = len(todo)

    def progress(n: int) -> None:
        with lock:
            done[0] += n
            now = time.monotonic()
            if now - last[0] >= 5:
                last[0] = now
                log(f"store: {done[0] / 2**30:.2f} GiB, {done[1]} of {total_files} files, "
                    f"{done[0] / 2**20 / (now - t0):.0f} MiB/s, {now - t0:.0f} s")

    def one(item: tuple[Pin, str, str]) -> None:
        pin, name, url = item
        dest = STORE / name
        partial = dest.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}.partial")
        h = hashlib.sha256()
        if url.startswith("/"):  # a find-links folder's file
            shutil.copyfile(url, partial)
            h.update(partial.read_bytes())
        else:
            try:
                _fetch_to(url, partial, h, progress)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        if h.hexdigest() not in pin.hashes:
            partial.unlink(missing_ok=True)
            raise LockError(f"{name}: sha256 {h.hexdigest()[:16]} is not the lock's for "
                            f"{pin.name}=={pin.version}")
        dest.with_name(dest.name + ".sha256").write_text(h.hexdigest() + "\n")
        partial.replace(dest)
        with lock:
            done[1] += 1

    log(f"store: downloading {total_files} wheels into {STORE}")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, todo))
    size = sum((STORE / n).stat().st_size for _, n, _ in todo)
    log(f"store: {total_files} wheels, {size / 2**30:.2f} GiB in {time.monotonic() - t0:.0f} s")


def _fetch_to(url: str, partial: Path, h, progress: Callable[[int], None]) -> None:
    with httpx.stream("GET", url, timeout=120, follow_redirects=True) as r, open(partial, "wb") as f:
        r.raise_for_status()
        for chunk in r.iter_bytes(1 << 20):
            f.write(chunk)
            h.update(chunk)
            progress(len(chunk))


def unpacked_size(wheels: Sequence[Path]) -> int:
    """What the wheels occupy installed (their members' sizes): the total an install's progress counts
    towards."""
    total = 0
    for w in wheels:
        side = w.with_name(w.name + ".unpacked")
        if side.exists():
            total += int(side.read_text())
            continue
        with zipfile.ZipFile(w) as z:
            n = sum(i.file_size for i in z.infolist())
        side.write_text(f"{n}\n")
        total += n
    return total


def stored(lock: Lock, target: Target) -> list[Path]:
    """The lock's files for the target already in the store, without a download; LockError when the
    store lacks any."""
    by_project = _by_project(p.name for p in STORE.glob("*.whl")) if STORE.exists() else {}
    out = []
    for pin in lock.pins:
        mine = [n for n in by_project.get(pin.name, ()) if n.split("-")[1] == pin.version]
        name = best_file({n: _sha_of_store(STORE / n) for n in mine}, pin, target)
        if name is None:
            raise LockError(f"the store lacks {pin.name}=={pin.version} for {target.key}")
        out.append(STORE / name)
    return out
