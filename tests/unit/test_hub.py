"""The pure side of hub models: the hub's listing read, what vLLM reads of it, what a host lacks, the
disk refusal; the controller's reading of a hub over HTTP (httpx's MockTransport answering as olah and
the public hub answer); the HubCache fact's script on a real cache layout; the fetch's token file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from vllm_fleet.controller import hub as hub_api
from vllm_fleet.core.hub import (
    HubFile,
    HubSnapshot,
    disk_refusals,
    files_of,
    missing,
    snapshot_dir,
    unresolved,
    wanted,
)
from vllm_fleet.host import hubfetch
from vllm_fleet.roles.facts import _HUB_CACHE_PY, HubCache

SHA = "4e059744c8ca8199611e4d3b3e6035be05f82cb8"
# olah 0.5.4's answer for the lab's repository (`/api/models/<repo>/tree/<sha>?recursive=true`), trimmed,
# and an LFS entry as the public hub lists one
TREE = [
    {"type": "file", "oid": "8f0e", "size": 612, "path": "config.json"},
    {"type": "directory", "oid": "1a2b", "size": 0, "path": "tokenizer"},
    {"type": "file", "oid": "9c1d", "size": 1936160, "path": "model.safetensors",
     "lfs": {"oid": "ab" * 32, "size": 1936160, "pointerSize": 134}},
    {"type": "file", "oid": "77aa", "size": 21412, "path": "tokenizer/tokenizer.json"},
]


def snap(files=None) -> HubSnapshot:
    return HubSnapshot("fleetlab/tiny-llama", "v1", SHA, "http://10.77.0.1:18090",
                       files if files is not None else files_of(TREE))


def test_the_listing_keeps_files_with_sizes_and_lfs_hashes() -> None:
    s = snap()
    assert [f.path for f in s.files] == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert s.files[1] == HubFile("model.safetensors", 1936160, "ab" * 32)
    assert (s.total_bytes, s.weight_bytes) == (612 + 1936160 + 21412, 1936160)
    assert s.describe() == f"fleetlab/tiny-llama@v1 = {SHA[:12]}"
    assert s.directory == snapshot_dir("fleetlab/tiny-llama", SHA) == (
        f"/var/lib/vllm/hf/hub/models--fleetlab--tiny-llama/snapshots/{SHA}")


def test_only_what_vllm_reads_is_fetched() -> None:
    def names(*paths: str) -> list[str]:
        return [f.path for f in wanted(HubFile(p, 1) for p in paths)]

    # Llama 3: Meta's original checkpoint beside the HF shards; pytorch copies beside safetensors
    assert names("config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                 "original/consolidated.00.pth", "original/params.json", "pytorch_model.bin",
                 "tokenizer.json") == ["config.json", "model-00001-of-00002.safetensors",
                                       "model.safetensors.index.json", "tokenizer.json"]
    # Mistral: consolidated.safetensors duplicates the shards; alone, it is the weights
    assert names("consolidated.safetensors", "model-00001-of-00001.safetensors", "params.json") == [
        "model-00001-of-00001.safetensors", "params.json"]
    assert names("consolidated.safetensors", "params.json") == ["consolidated.safetensors", "params.json"]
    # no safetensors: the .bin weights; other frameworks' formats never
    assert names("pytorch_model.bin", "model.onnx", "flax_model.msgpack", "q4.gguf", "config.json") == [
        "pytorch_model.bin", "config.json"]


def test_a_file_at_another_size_counts_as_missing() -> None:
    s = snap()
    present = {"config.json": 612, "model.safetensors": 1000}
    assert [f.path for f in missing(s, present)] == ["model.safetensors", "tokenizer/tokenizer.json"]
    assert missing(s, {f.path: f.size for f in s.files}) == []


def test_disk_refusal_names_host_path_needed_and_free_and_sums_instances() -> None:
    s = snap()
    assert disk_refusals("gpu-1", [("chat", s, "/var/lib/vllm", {})], {"/var/lib/vllm": 10 * 2**20}) == []
    assert disk_refusals("gpu-1", [("chat", s, "/var/lib/vllm", {})], {"/var/lib/vllm": None}) == []
    line = disk_refusals("gpu-1", [("chat", s, "/var/lib/vllm", {"model.safetensors": 1936160})],
                         {"/var/lib/vllm": 2**10})
    assert line == [f"gpu-1: vllm.instances[chat].model: fetching fleetlab/tiny-llama@v1 = {SHA[:12]} needs "
                    "22 KiB in /var/lib/vllm, 1 KiB free there; free space or move the vllm user's cache to "
                    "a larger disk"]
    # two snapshots that fit one by one but not together; one snapshot two instances share counts once
    other = HubSnapshot("org/other", "main", "c" * 40, "https://hub", (HubFile("w.safetensors", 3 * 2**20),))
    two = [("a", s, "/var/lib/vllm", {}), ("b", other, "/var/lib/vllm", {}), ("c", s, "/var/lib/vllm", {})]
    (refusal,) = disk_refusals("gpu-1", two, {"/var/lib/vllm": 4 * 2**20})
    assert "fetching fleetlab/tiny-llama@v1 = 4e059744c8ca (1.9 MiB, instance a) and org/other@main = " \
           "cccccccccccc (3.0 MiB, instance b) needs 4.9 MiB" in refusal
    assert disk_refusals("gpu-1", two[:1] + two[2:], {"/var/lib/vllm": 2 * 2**20}) == []


def test_read_only_work_leaves_the_commit_unresolved_unless_given() -> None:
    assert not unresolved("org/m", "main", None).resolved
    assert unresolved("org/m", "c" * 40, None).sha == "c" * 40


def test_the_fetch_reads_only_hf_token_from_its_file(tmp_path: Path) -> None:
    f = tmp_path / "default.hub.env"
    f.write_text("# written by vllm-fleet\nHF_TOKEN=hf_abc\nOTHER=x\n")
    assert hubfetch._token(str(f)) == "hf_abc"
    assert hubfetch._token(None) is None


def test_the_hub_cache_fact_reads_sizes_through_links_and_the_free_space(tmp_path: Path) -> None:
    """The fact's own script on huggingface_hub's layout: links into blobs/, a nested file, a broken link."""
    top = tmp_path / "hub" / "models--org--m"
    (top / "blobs").mkdir(parents=True)
    snapdir = top / "snapshots" / SHA
    (snapdir / "tokenizer").mkdir(parents=True)
    (top / "blobs" / "b1").write_bytes(b"x" * 612)
    (top / "blobs" / "b2").write_bytes(b"y" * 10)
    (snapdir / "config.json").symlink_to("../../blobs/b1")
    (snapdir / "tokenizer" / "tokenizer.json").symlink_to("../../../blobs/b2")
    (snapdir / "model.safetensors").symlink_to("../../blobs/gone")
    out = subprocess.run(["python3", "-c", _HUB_CACHE_PY, str(snapdir), str(tmp_path / "hub" / "x")],
                         capture_output=True, text=True, check=True).stdout
    found = HubCache().process(out.splitlines())
    assert found["present"] == {"config.json": 612, "tokenizer/tokenizer.json": 10}
    assert found["fs_path"] == str(tmp_path / "hub") and found["free"] > 0
    assert [f.path for f in missing(snap(), found["present"])] == ["model.safetensors",
                                                                   "tokenizer/tokenizer.json"]


def _hub(handler) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


@pytest.fixture()
def mock_hub(monkeypatch):
    """Requests the controller makes, answered by `answer(request) -> httpx.Response`."""
    seen: list[httpx.Request] = []
    real = httpx.Client

    def use(answer):
        seen.clear()

        def client(**kw):
            return real(transport=_hub(lambda r: (seen.append(r), answer(r))[1]), **kw)

        monkeypatch.setattr(hub_api.httpx, "Client", client)
        return seen
    return use


def test_resolve_reads_revision_tree_and_config(mock_hub) -> None:
    def answer(r: httpx.Request) -> httpx.Response:
        if r.url.path.endswith("/revision/v1"):
            return httpx.Response(200, json={"sha": SHA})
        if "/tree/" in r.url.path:
            return httpx.Response(200, json=TREE)
        if r.url.path.endswith("config.json"):
            return httpx.Response(200, json={"num_attention_heads": 4})
        return httpx.Response(404)

    seen = mock_hub(answer)
    s = hub_api.resolve("http://10.77.0.1:18090/", "fleetlab/tiny-llama", "v1", "hf_tok")
    assert (s.sha, s.endpoint, s.config) == (SHA, "http://10.77.0.1:18090", {"num_attention_heads": 4})
    assert all(r.headers["authorization"] == "Bearer hf_tok" for r in seen)


def test_an_unknown_revision_is_told_from_an_unknown_repository(mock_hub) -> None:
    # olah answers 401 "Repository not found" for both; the repository's main branch tells them apart
    mock_hub(lambda r: httpx.Response(200, json={"sha": SHA}) if r.url.path.endswith("/revision/main")
             else httpx.Response(401, json={"error": "Repository not found"}))
    with pytest.raises(hub_api.HubError) as e:
        hub_api.resolve(None, "org/m", "no-such-tag", None)
    assert e.value.field == "revision" and "'no-such-tag' is not a branch, tag or commit" in str(e.value)
    mock_hub(lambda r: httpx.Response(401, json={"error": "Repository not found"}))
    with pytest.raises(hub_api.HubError) as e:
        hub_api.resolve(None, "org/nope", "v1", None)
    assert e.value.field == "hf_repo" and "answered 401" in str(e.value)


def test_a_listing_never_follows_a_next_page_to_another_server_or_in_a_circle(mock_hub) -> None:
    def pages(link: str):
        def answer(r: httpx.Request) -> httpx.Response:
            if r.url.path.endswith("/revision/main"):
                return httpx.Response(200, json={"sha": SHA})
            return httpx.Response(200, json=TREE, headers={"link": f'<{link}>; rel="next"'})
        return answer

    seen = mock_hub(pages("https://huggingface.co/api/models/org/m/tree/x?cursor=1"))
    with pytest.raises(hub_api.HubError, match="next page is on another server"):
        hub_api.resolve("https://mirror.internal", "org/m", None, "hf_tok")
    assert {r.url.host for r in seen} == {"mirror.internal"}  # the token went nowhere else
    seen = mock_hub(pages(f"/api/models/org/m/tree/{SHA}?recursive=true"))  # the same page again
    assert hub_api.resolve("https://mirror.internal", "org/m", None, None).sha == SHA
    assert sum("/tree/" in r.url.path for r in seen) == 1


def test_a_page_that_is_not_the_hubs_json_is_a_refusal_not_a_traceback(mock_hub) -> None:
    mock_hub(lambda r: httpx.Response(200, text="<html>proxy login</html>"))
    with pytest.raises(hub_api.HubError, match="is not the hub's JSON"):
        hub_api.resolve("https://mirror.internal", "org/m", None, None)


def test_fact_output_survives_a_broken_run() -> None:
    """An unreadable cache reads as empty with the free space unknown (the fetch checks space again)."""
    assert HubCache().process(["Traceback (most recent call last):"]) == {"present": {}, "free": None,
                                                                          "fs_path": None}
