"""The controller's reading of a hub at plan time: a revision resolved to its commit, the commit's file
listing (sizes for the disk preflight) and its config.json (heads for the TP rule, sizes for the memory
preflight), over the hub's HTTP API.

Why on the controller: it already holds the token (hf_token_env), it asks once per repository and
revision whatever the host count, and an unknown repository or revision is refused before any host is
touched. The hosts then fetch exactly that commit (vllm_fleet/host/hubfetch.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from vllm_fleet.core.hub import HubSnapshot, endpoint_of, files_of

TIMEOUT_S = 30.0
_SHA = re.compile(r"^[0-9a-f]{40}$")
_NEXT = re.compile(r'<([^>]+)>;\s*rel="next"')


class HubError(Exception):
    """What the hub answered, in words for a refusal (the caller adds host and field)."""

    def __init__(self, message: str, field: str = "hf_repo"):
        super().__init__(message)
        self.field = field


def _get(client: httpx.Client, url: str, what: str, revision: str) -> httpx.Response:
    try:
        r = client.get(url)
    except httpx.HTTPError as e:
        raise HubError(f"cannot reach the hub for {what} ({url}): {type(e).__name__}: {e}") from None
    if r.status_code == 200:
        return r
    code = r.headers.get("x-error-code", "")
    if code == "RevisionNotFound" or (r.status_code == 404 and "revision" in r.text.lower()):
        raise HubError(f"{revision!r} is not a branch, tag or commit of {what}", field="revision")
    if r.status_code in (401, 403, 404):
        hint = ("no such repository, or it is private or gated: set hf_token_env to a variable holding a "
                "token that may read it")
        raise HubError(f"{what}: the hub answered {r.status_code} ({hint})")
    raise HubError(f"{what}: the hub answered {r.status_code} for {url}")


def _exists(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def resolve(endpoint: str | None, repo: str, revision: str | None, token: str | None) -> HubSnapshot:
    """`repo` at `revision` (default main) as a commit with its files and config.json; HubError when the
    hub cannot be read or does not have it."""
    base = endpoint_of(endpoint)
    rev = revision or "main"
    what = f"{repo} at {base}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(headers=headers, timeout=TIMEOUT_S, follow_redirects=True) as client:
        try:
            info = _get(client, f"{base}/api/models/{repo}/revision/{quote(rev, safe='')}", what, rev).json()
        except HubError as e:
            # hubs differ in how they say "no such revision" (the hub: 404 RevisionNotFound; olah: 401
            # "Repository not found", or 500 for an unknown commit): a repository whose main branch
            # answers has no such revision
            if e.field == "revision" or rev == "main" or not _exists(
                    client, f"{base}/api/models/{repo}/revision/main"):
                raise
            raise HubError(f"{rev!r} is not a branch, tag or commit of {what}", field="revision") from None
        sha = str(info.get("sha") or "")
        if not _SHA.match(sha):
            raise HubError(f"{what}: the hub gave no commit for {rev!r} (sha {sha!r})", field="revision")
        tree: list[Mapping[str, Any]] = []
        url: str | None = f"{base}/api/models/{repo}/tree/{sha}?recursive=true"
        while url:
            r = _get(client, url, what, rev)
            tree.extend(r.json())
            found = _NEXT.search(r.headers.get("link", ""))
            url = found.group(1) if found else None
        files = files_of(tree)
        config = None
        if any(f.path == "config.json" for f in files):
            config = _get(client, f"{base}/{repo}/resolve/{sha}/config.json", what, rev).json()
    if not files:
        raise HubError(f"{what}: commit {sha[:12]} ({rev}) lists no files", field="revision")
    return HubSnapshot(repo=repo, revision=rev, sha=sha, endpoint=base, files=files, config=config)
