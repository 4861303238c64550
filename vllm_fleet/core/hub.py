"""Models from a Hugging Face-compatible hub: what a pinned revision is, where it lives on a host, and
whether the host has room for it. Pure: the controller reads the hub (vllm_fleet/controller/hub.py), the
host's cache is a fact (roles/facts.py HubCache), the fetch runs on the host
(vllm_fleet/host/hubfetch.py).

Why the deploy fetches instead of vLLM: vLLM downloads at start, so a restart's downtime would include
the download, and the memory and tensor-parallel checks would have no config.json to read before it. A
revision is resolved to its commit once, at plan time; that commit's files are what every check reads,
what the host fetches and what the unit serves, from a snapshot directory, offline.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.core.spec import VLLM_WRITABLE

DEFAULT_ENDPOINT = "https://huggingface.co"
# huggingface_hub's own layout under HF_HOME (the unit's HF_HOME is VLLM_WRITABLE/hf): the fetch and the
# host's prune (vllm_fleet/host/hoststate.py HUB_CACHE) use it as it is, so tools that know it still work
HF_HOME = f"{VLLM_WRITABLE}/hf"
HUB_CACHE = f"{HF_HOME}/hub"
# where the fetch's token waits on the host, 0600 root (the unit never reads it: serving is offline)
SHA = re.compile(r"^[0-9a-f]{40}$")
UNRESOLVED = "unresolved"  # the commit of a snapshot that read-only work (status, rollback) did not ask for
# what vLLM never reads from a repository: other frameworks' formats, and Meta's original checkpoint
OTHER_FORMATS = (".gguf", ".onnx", ".onnx_data", ".h5", ".msgpack", ".ot", ".tflite", ".pth", ".nemo")
TOKEN_SUFFIX = ".hub.env"  # a secret file to roles/ops.py (never hashed on the host)


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None = None  # an LFS file's content hash, as the hub lists it


@dataclass(frozen=True)
class HubSnapshot:
    """One repository at one commit, as the hub listed it at plan time."""

    repo: str
    revision: str  # what the inventory asked for: a branch, tag or commit
    sha: str  # the commit it resolved to: what is fetched, served and recorded
    endpoint: str
    files: tuple[HubFile, ...]  # what the fetch downloads (wanted() of the hub's listing)
    config: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int | None:
        """The safetensors files' sizes: the weights within a few kB (each file's JSON header)."""
        return sum(f.size for f in self.files if f.path.endswith(".safetensors")) or None

    @property
    def resolved(self) -> bool:
        return self.sha != UNRESOLVED

    @property
    def directory(self) -> str:
        return snapshot_dir(self.repo, self.sha)

    def describe(self) -> str:
        pinned = self.sha[:12] if self.revision == self.sha else f"{self.revision} = {self.sha[:12]}"
        return f"{self.repo}@{pinned}"


def snapshot_dir(repo: str, sha: str) -> str:
    return f"{HUB_CACHE}/models--{repo.replace('/', '--')}/snapshots/{sha}"


def endpoint_of(endpoint: str | None) -> str:
    return (endpoint or DEFAULT_ENDPOINT).rstrip("/")


def unresolved(repo: str, revision: str | None, endpoint: str | None) -> HubSnapshot:
    """A hub model for work that only reads what is deployed (status, rollback, targets, bench): the hub
    is not asked, so it may be down. A commit given as the revision is kept; else the commit is unknown."""
    rev = revision or "main"
    return HubSnapshot(repo, rev, rev if SHA.match(rev) else UNRESOLVED, endpoint_of(endpoint), ())


def wanted(files: Iterable[HubFile]) -> tuple[HubFile, ...]:
    """What vLLM reads of a repository, as it picks weights (vllm_fleet/core/modelinfo.py): safetensors
    when there are any (without `consolidated*` beside HF-format shards), else `.bin`/`.pt`; every other
    file but other frameworks' formats and `original/` (Meta's checkpoint). A Llama 3 repository's
    original/ alone is the size of its weights; a Mistral one's consolidated.safetensors doubles them."""
    top = [f for f in files if not f.path.startswith("original/") and not f.path.endswith(OTHER_FORMATS)]
    st = [f for f in top if f.path.endswith(".safetensors")]
    duplicate = {f.path for f in st if posixpath.basename(f.path).startswith("consolidated")}
    if len(duplicate) == len(st):
        duplicate = set()
    return tuple(f for f in top if f.path not in duplicate
                 and not (st and f.path.endswith((".bin", ".pt"))))


def files_of(tree: Sequence[Mapping[str, Any]]) -> tuple[HubFile, ...]:
    """The hub's recursive tree listing (`/api/models/<repo>/tree/<sha>?recursive=true`) as files."""
    out = []
    for item in tree:
        if item.get("type") != "file":
            continue
        lfs = item.get("lfs") or {}
        out.append(HubFile(str(item["path"]), int(item.get("size") or lfs.get("size") or 0),
                           lfs.get("oid") or lfs.get("sha256")))
    return tuple(sorted(out, key=lambda f: f.path))


def missing(snap: HubSnapshot, present: Mapping[str, int]) -> list[HubFile]:
    """Files of the snapshot the host's cache lacks or holds at another size (`present`: path -> size)."""
    return [f for f in snap.files if present.get(f.path) != f.size]


def disk_refusals(host: str, needs: Sequence[tuple[str, HubSnapshot, str, Mapping[str, int]]],
                  free: Mapping[str, int | None]) -> list[str]:
    """Refused before anything is fetched when a file system of the cache cannot hold what the host's
    snapshots lack, together. `needs`: (instance, snapshot, its file system's path, the files present by
    path) per instance, `free`: bytes free per file system path (None: not read; the fetch checks again).
    A snapshot two instances share counts once."""
    by_fs: dict[str, list[tuple[str, HubSnapshot, int]]] = {}
    seen = set()
    for inst, snap, fs_path, present in needs:
        if snap.directory not in seen:
            seen.add(snap.directory)
            by_fs.setdefault(fs_path, []).append((inst, snap, sum(f.size for f in missing(snap, present))))
    out = []
    for fs_path, items in by_fs.items():
        need, room = sum(n for _, _, n in items), free.get(fs_path)
        if room is None or need <= room:
            continue
        lacking = [(i, s, n) for i, s, n in items if n]
        what = (lacking[0][1].describe() if len(lacking) == 1
                else " and ".join(f"{s.describe()} ({size(n)}, instance {i})" for i, s, n in lacking))
        out.append(f"{host}: vllm.instances[{lacking[0][0]}].model: fetching {what} needs {size(need)} in "
                   f"{fs_path}, {size(room)} free there; free space or move the vllm user's cache to a "
                   "larger disk")
    return out


def size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"
