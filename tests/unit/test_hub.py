"""The pure side of hub models: the hub's listing read, what a host lacks, the disk refusal, and the
token file the fetch reads (vllm_fleet/host/hubfetch.py)."""

from __future__ import annotations

from pathlib import Path

from vllm_fleet.core.hub import HubFile, HubSnapshot, disk_refusal, files_of, missing, snapshot_dir
from vllm_fleet.host import hubfetch

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


def test_a_file_at_another_size_counts_as_missing() -> None:
    s = snap()
    present = {"config.json": 612, "model.safetensors": 1000}
    assert [f.path for f in missing(s, present)] == ["model.safetensors", "tokenizer/tokenizer.json"]
    assert missing(s, {f.path: f.size for f in s.files}) == []


def test_disk_refusal_names_host_path_needed_and_free() -> None:
    s = snap()
    assert disk_refusal("gpu-1", "chat", s, {}, 10 * 2**20) is None
    assert disk_refusal("gpu-1", "chat", s, {}, None) is None  # not read: the fetch checks again
    line = disk_refusal("gpu-1", "chat", s, {"model.safetensors": 1936160}, 2**10, "/var/lib/vllm")
    assert line == (f"gpu-1: vllm.instances[chat].model: fetching fleetlab/tiny-llama@v1 = {SHA[:12]} needs "
                    "0.0 MiB in /var/lib/vllm, 0.0 MiB free there; free space or move the vllm user's "
                    "cache to a larger disk")


def test_the_fetch_reads_only_hf_token_from_its_file(tmp_path: Path) -> None:
    f = tmp_path / "default.hub.env"
    f.write_text("# written by vllm-fleet\nHF_TOKEN=hf_abc\nOTHER=x\n")
    assert hubfetch._token(str(f)) == "hf_abc"
    assert hubfetch._token(None) is None
