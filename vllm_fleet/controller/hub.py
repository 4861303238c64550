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
from urllib.parse import quote, urljoin, urlsplit

import httpx

from vllm_fleet.core.hub import SHA, HubSnapshot, endpoint_of, files_of, wanted

TIMEOUT_S = 30.0
MAX_PAGES = 100  # the hub lists 1000 entries a page; no model repository comes near
_NEXT = re.compile(r'<([^>]+)>;\s*rel="next"')


class HubError(Exception):
    """What the hub answered, in words for a refusal (the caller adds host and field); `status` is the
    HTTP status, None when the hub was not reached or answered something other than its API."""

    def __init__(self, message: str, field: str = "hf_repo", status: int | None = None):
        super().__init__(message)
        self.field, self.status = field, status


def _get(client: httpx.Client, url: str, what: str, revision: str) -> httpx.Response:
    try:
        r = client.get(url)
    except httpx.HTTPError as e:
        raise HubError(f"cannot reach the hub for {what}: {type(e).__name__}: {e}") from None
    if r.status_code == 200:
        return r
    code = r.headers.get("x-error-code", "")
    if code == "RevisionNotFound":
        raise HubError(f"{revision!r} is not a branch, tag or commit of {what}", "revision", r.status_code)
    if r.status_code in (401, 403, 404):
        hint = ("no such repository, or it is private or gated: set hf_token_env to a variable holding a "
                "token that may read it")
        raise HubError(f"{what}: the hub answered {r.status_code} ({hint})", status=r.status_code)
    raise HubError(f"{what}: the hub answered {r.status_code} for {urlsplit(url).path}", status=r.status_code)


def _json(r: httpx.Response, what: str) -> Any:
    try:
        return r.json()
    except ValueError:
        raise HubError(f"{what}: the answer to {urlsplit(str(r.url)).path} is not the hub's JSON (a proxy's "
                       "page?)") from None


def _exists(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def _tree(client: httpx.Client, base: str, repo: str, sha: str, what: str) -> list[Mapping[str, Any]]:
    """Every page of the listing. A next page is followed only on the hub's own origin (the token goes
    with each request; a mirror may pass on its upstream's links), and a repeated link ends the listing."""
    origin = urlsplit(base)[:2]
    tree: list[Mapping[str, Any]] = []
    url: str | None = f"{base}/api/models/{repo}/tree/{sha}?recursive=true"
    seen: set[str] = set()
    while url and url not in seen:
        if len(seen) >= MAX_PAGES:
            raise HubError(f"{what}: the listing of {sha[:12]} goes on past {MAX_PAGES} pages")
        seen.add(url)
        r = _get(client, url, what, sha)
        page = _json(r, what)
        if not isinstance(page, list):
            raise HubError(f"{what}: the listing of {sha[:12]} is not a list of files")
        tree.extend(page)
        found = _NEXT.search(r.headers.get("link", ""))
        url = urljoin(str(r.url), found.group(1)) if found else None
        if url and urlsplit(url)[:2] != origin:
            raise HubError(f"{what}: the listing's next page is on another server ({urlsplit(url).netloc})")
    return tree


def resolve(endpoint: str | None, repo: str, revision: str | None, token: str | None) -> HubSnapshot:
    """`repo` at `revision` (default main) as a commit with the files vLLM reads and its config.json;
    HubError when the hub cannot be read or does not have it."""
    base = endpoint_of(endpoint)
    rev = revision or "main"
    what = f"{repo} at {base}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(headers=headers, timeout=TIMEOUT_S, follow_redirects=True) as client:
        try:
            info = _json(_get(client, f"{base}/api/models/{repo}/revision/{quote(rev, safe='')}", what, rev),
                         what)
        except HubError as e:
            # hubs differ in how they say "no such revision" (the hub: 404 RevisionNotFound; olah: 401
            # "Repository not found", or 500 for an unknown commit): a repository whose main branch
            # answers has no such revision. Not reached at all: said as it is.
            if e.field == "revision" or e.status is None or rev == "main" or not _exists(
                    client, f"{base}/api/models/{repo}/revision/main"):
                raise
            raise HubError(f"{rev!r} is not a branch, tag or commit of {what}", "revision",
                           e.status) from None
        sha = str(info.get("sha") or "") if isinstance(info, dict) else ""
        if not SHA.match(sha):
            raise HubError(f"{what}: the hub gave no commit for {rev!r} (sha {sha!r})", field="revision")
        listed = files_of(_tree(client, base, repo, sha, what))
        files = wanted(listed)
        config = None
        if any(f.path == "config.json" for f in files):
            config = _json(_get(client, f"{base}/{repo}/resolve/{sha}/config.json", what, rev), what)
    if not files:
        raise HubError(f"{what}: commit {sha[:12]} ({rev}) lists no files vLLM reads", field="revision")
    return HubSnapshot(repo=repo, revision=rev, sha=sha, endpoint=base, files=files, config=config)
