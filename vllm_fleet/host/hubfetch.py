"""Fetch one hub commit into the vllm user's HF cache, before anything restarts.

Runs ON the host as root with a release's interpreter (its huggingface_hub, a vLLM dependency), uploaded
by the deploy to /usr/local/lib/vllm-fleet/. Root only reads the token file; everything after that runs
as the vllm user (the cache is its own, and a hub's answers are never handled with root's rights).

Why not vLLM's own download at start: the restart's downtime would include it, and a hub outage would
fail the start. Here the old service keeps serving while this runs; the unit then serves the snapshot
directory offline. A file the hub lists at a size or LFS hash other than what landed fails the fetch.

Only the files the plan checked are fetched (--file, vllm_fleet/core/hub.py wanted). Progress goes to
stdout every few seconds (bytes, total, rate, elapsed). Files already complete are not downloaded
again (a rerun after an interrupted fetch gets only the rest); a file cut off mid-way starts over. A
file that does not match is removed again, so the next run fetches it instead of serving it.

Usage: python hubfetch.py --repo ORG/NAME --sha COMMIT --endpoint URL --hf-home DIR --user vllm
       --file PATH [--file PATH ...] [--token-file FILE]
       (exit 0 = fetched and verified; 1 = failed, reason on stderr)
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import pwd
import sys
import threading
import time

CHUNK = 1 << 20


def _token(path: str | None) -> str | None:
    """HF_TOKEN=<value> from the deploy's 0600 file (the value never passes through argv)."""
    if not path:
        return None
    with open(path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            if key == "HF_TOKEN" and value:
                return value
    return None


def _drop_to(user: str, env: dict[str, str]) -> None:
    """The user's rights and nothing of root's environment but PATH and the locale."""
    pw = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    os.environ.clear()
    os.environ.update(keep, HOME=pw.pw_dir, **env)
    os.umask(0o027)


def _blob_bytes(blobs: str) -> int:
    total = 0
    try:
        with os.scandir(blobs) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        pass
    return total


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class Progress(threading.Thread):
    """Reads the blobs directory's growth (huggingface_hub writes each file there as a temporary
    *.incomplete), so it counts what is downloaded without hooking into huggingface_hub's internals."""

    def __init__(self, label: str, blobs: str, already: int, total: int, every_s: float = 3.0):
        super().__init__(daemon=True)
        self.label, self.blobs, self.already, self.total, self.every_s = label, blobs, already, total, every_s
        self.start_bytes = _blob_bytes(blobs)
        self.t0 = time.monotonic()
        self.done = threading.Event()

    def fetched(self) -> int:
        return max(0, _blob_bytes(self.blobs) - self.start_bytes)

    def line(self, done: bool = False) -> str:
        """`done`: all there (files whose content another revision's blobs already held took no bytes)."""
        got, elapsed = self.fetched(), time.monotonic() - self.t0
        have = self.total if done else min(self.total, self.already + got)
        pct = 100 * have / self.total if self.total else 100
        rate = got / elapsed if elapsed > 0 else 0
        return (f"fetch {self.label}: {_size(have)} of {_size(self.total)} ({pct:.0f}%), "
                f"{rate / 2**20:.1f} MiB/s, {elapsed:.0f} s")

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            print(self.line(), flush=True)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _remove(path: str) -> None:
    """A snapshot's file and the blob it links to: huggingface_hub trusts a link that exists."""
    if os.path.islink(path):
        blob = os.path.join(os.path.dirname(path), os.readlink(path))
        if os.path.isfile(blob):
            os.unlink(blob)
    if os.path.lexists(path):
        os.unlink(path)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--sha", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--hf-home", required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--file", action="append", required=True, dest="files")
    ap.add_argument("--token-file")
    args = ap.parse_args(argv)
    token = _token(args.token_file)
    cache = os.path.join(args.hf_home, "hub")
    # no xet chunk cache: it would fill the vllm user's home beside the snapshot, unseen by the disk check
    _drop_to(args.user, {"HF_HOME": args.hf_home, "HF_HUB_CACHE": cache, "HF_ENDPOINT": args.endpoint,
                         "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                         "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0"})
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    label = f"{args.repo}@{args.sha[:12]}"
    wanted = set(args.files)
    api = HfApi(endpoint=args.endpoint, token=token or False)
    try:
        listed = [f for f in api.list_repo_tree(args.repo, revision=args.sha, recursive=True)
                  if hasattr(f, "size") and f.path in wanted]
    except Exception as e:
        print(f"fetch {label}: the hub at {args.endpoint} cannot be read: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    gone = wanted - {f.path for f in listed}
    if gone:
        print(f"fetch {label}: the hub no longer lists {', '.join(sorted(gone))}", file=sys.stderr)
        return 1
    total = sum(f.size for f in listed)
    repo_dir = os.path.join(cache, repo_folder_name(repo_id=args.repo, repo_type="model"))
    snap = os.path.join(repo_dir, "snapshots", args.sha)
    have = sum(f.size for f in listed if os.path.isfile(os.path.join(snap, f.path))
               and os.stat(os.path.join(snap, f.path)).st_size == f.size)
    os.makedirs(cache, exist_ok=True)
    st = os.statvfs(cache)
    free = st.f_bavail * st.f_frsize
    if total - have > free:
        print(f"fetch {label}: needs {_size(total - have)} in {cache}, {_size(free)} free", file=sys.stderr)
        return 1
    print(f"fetch {label}: {len(listed)} files, {_size(total)}"
          + (f" ({_size(have)} already here)" if have else "") + f" from {args.endpoint}", flush=True)
    progress = Progress(label, os.path.join(repo_dir, "blobs"), have, total)
    progress.start()
    try:
        snapshot_download(args.repo, revision=args.sha, cache_dir=cache, token=token or False,
                          endpoint=args.endpoint, max_workers=4,
                          allow_patterns=[glob.escape(p) for p in sorted(wanted)])
    except Exception as e:
        print(f"fetch {label}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        progress.done.set()
    bad = []
    for f in listed:  # what every check before the restart read: the plan's sizes, the hub's hashes
        path = os.path.join(snap, f.path)
        size = os.stat(path).st_size if os.path.isfile(path) else None
        lfs = getattr(f, "lfs", None)
        want = getattr(lfs, "sha256", None) if lfs is not None else None
        if size != f.size:
            bad.append(f"{f.path}: {size} bytes, the hub lists {f.size}")
        elif want and _sha256(path) != want:
            bad.append(f"{f.path}: sha256 differs from the hub's LFS hash")
        else:
            continue
        _remove(path)
    if bad:
        print(f"fetch {label}: the snapshot is not what the hub lists (removed again): {'; '.join(bad)}",
              file=sys.stderr)
        return 1
    print(f"{progress.line(done=True)}; verified {len(listed)} files", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
