"""Models from a Hugging Face-compatible hub: what a pinned revision is, where it lives on a host, and
whether the host has room for it. Pure: the controller reads the hub (vllm_fleet/controller/hub.py), the
host's cache is a fact (vllm_fleet/deploy/facts.py HubCache), the fetch runs on the host
(vllm_fleet/host/hubfetch.py).

Why the deploy fetches instead of vLLM: vLLM downloads at start, so a restart's downtime would include
the download, and the memory and tensor-parallel checks would have no config.json to read before it. A
revision is resolved to its commit once, at plan time; that commit's files are what every check reads,
what the host fetches and what the unit serves, from a snapshot directory, offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.core.spec import VLLM_WRITABLE

DEFAULT_ENDPOINT = "https://huggingface.co"
# huggingface_hub's own layout under HF_HOME (the unit's HF_HOME is VLLM_WRITABLE/hf): the fetch and the
# host's prune (vllm_fleet/host/hoststate.py HUB_CACHE) use it as it is, so tools that know it still work
HF_HOME = f"{VLLM_WRITABLE}/hf"
HUB_CACHE = f"{HF_HOME}/hub"
# where the fetch's token waits on the host, 0600 root (the unit never reads it: serving is offline)
TOKEN_SUFFIX = ".hub.env"  # a secret file to vllm_fleet/deploy/ops.py (never hashed on the host)


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
    files: tuple[HubFile, ...]
    config: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int | None:
        """The safetensors files' sizes: the weights within a few kB (each file's JSON header)."""
        return sum(f.size for f in self.files if f.path.endswith(".safetensors")) or None

    @property
    def directory(self) -> str:
        return snapshot_dir(self.repo, self.sha)

    def describe(self) -> str:
        pinned = self.sha[:12] if self.revision == self.sha else f"{self.revision} = {self.sha[:12]}"
        return f"{self.repo}@{pinned}"


def repo_dir(repo: str) -> str:
    return f"{HUB_CACHE}/models--{repo.replace('/', '--')}"


def snapshot_dir(repo: str, sha: str) -> str:
    return f"{repo_dir(repo)}/snapshots/{sha}"


def endpoint_of(endpoint: str | None) -> str:
    return (endpoint or DEFAULT_ENDPOINT).rstrip("/")


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


def disk_refusal(host: str, inst: str, snap: HubSnapshot, present: Mapping[str, int], free: int | None,
                 path: str = HUB_CACHE) -> str | None:
    """Refused before anything is fetched when the cache's file system cannot hold what is missing."""
    need = sum(f.size for f in missing(snap, present))
    if free is None or need <= free:
        return None
    return (f"{host}: vllm.instances[{inst}].model: fetching {snap.describe()} needs {_gib(need)} in "
            f"{path}, {_gib(free)} free there; free space or move the vllm user's cache to a larger disk")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
