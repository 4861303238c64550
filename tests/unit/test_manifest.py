"""The Manifest fact's host-side script, run here on real files (the same python3 code the hosts run):
a file whose stat is unchanged is not read again, a changed one always is."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vllm_fleet.roles.ops import _MANIFEST_PY, Manifest


def manifest(sums: Path, *paths: Path) -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", _MANIFEST_PY, str(sums), *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 4)[4]: line.split(" ", 4)[:4] for line in out.splitlines()}


def aged(f: Path) -> None:
    """Files younger than 2 s are never cached: wait that out instead of faking a clock."""
    time.sleep(max(0.0, os.stat(f).st_ctime + 2.1 - time.time()))


def test_hashes_owner_and_mode_like_sha256sum_and_stat(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_bytes(b'{"a": 1}')
    f.chmod(0o640)
    got = manifest(tmp_path / "sums.json", f, tmp_path / "missing")
    assert got[str(f)][0] == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert got[str(f)][3] == "640"
    assert got[str(tmp_path / "missing")] == ["-", "-", "-", "-"]


def record(sums: Path, *pairs: tuple[Path, str]) -> None:
    """synced_files' record command, as root runs it on the host after renaming files into place."""
    from vllm_fleet.roles.ops import _RECORD_PY

    subprocess.run([sys.executable, "-c", _RECORD_PY, str(sums), *(str(x) for p in pairs for x in p)],
                   check=True)


def test_the_fact_writes_nothing_and_reads_what_the_upload_recorded(tmp_path: Path) -> None:
    sums, f = tmp_path / "state" / "sums.json", tmp_path / "model.safetensors"
    f.write_bytes(b"weights v1")
    first = manifest(sums, f)
    assert not sums.exists()  # a fact never writes, so --dry changes nothing on the host
    record(sums, (f, hashlib.sha256(b"weights v1").hexdigest()))
    assert manifest(sums, f) == first
    # prove the record is what answers: a planted checksum comes back while the stat is unchanged
    record(sums, (f, "planted"))
    assert manifest(sums, f)[str(f)][0] == "planted"
    # same size, mtime put back: the ctime moved, so the file is read again
    st = os.stat(f)
    time.sleep(0.05)  # past the file system's timestamp granularity
    f.write_bytes(b"weights v2")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert manifest(sums, f)[str(f)][0] == hashlib.sha256(b"weights v2").hexdigest()
    assert json.loads(sums.read_text())[str(f)][4] == "planted"  # still not written by the fact


def test_a_record_drops_files_that_are_gone_and_never_keeps_a_secret(tmp_path: Path) -> None:
    sums, a, b, env = tmp_path / "sums.json", tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "x.env"
    for p in (a, b, env):
        p.write_text(p.name)
    record(sums, (a, "1" * 64), (b, "2" * 64))
    cache = json.loads(sums.read_text())
    cache[str(env)] = [0, 0, 0, 0, "3" * 64]  # an old layout's entry for a secret file
    sums.write_text(json.dumps(cache))
    b.unlink()
    record(sums, (a, "1" * 64))
    assert set(json.loads(sums.read_text())) == {str(a)}
    assert manifest(sums, env)[str(env)][0] == "unverified"


def test_fact_command_is_one_python3_call_over_every_path() -> None:
    cmd = Manifest().command(("/etc/vllm/default.yaml", "/etc/vllm/default.env"))
    assert cmd.startswith("python3 -c ") and cmd.endswith("/etc/vllm/default.yaml /etc/vllm/default.env")


def _fresh_controller_cache(monkeypatch, path: Path) -> None:
    import vllm_fleet.roles.ops as ops

    monkeypatch.setattr(ops, "LOCAL_SUMS", path)
    monkeypatch.setattr(ops, "_FRESH", {})
    # a new run reads the file again; this test's cache goes away with the test
    monkeypatch.setattr(ops, "_local_sums", functools.cache(ops._local_sums.__wrapped__))


def test_the_controller_hashes_a_file_once_across_runs_and_again_when_it_changes(tmp_path, monkeypatch):
    from vllm_fleet.roles.ops import sha256

    sums, f = tmp_path / "sums.json", tmp_path / "uv"
    f.write_bytes(b"uv 0.9")
    aged(f)
    _fresh_controller_cache(monkeypatch, sums)
    assert sha256(str(f)) == hashlib.sha256(b"uv 0.9").hexdigest()
    assert str(f) in json.loads(sums.read_text())
    # a later run reads the stored sum: prove it by storing a wrong one under the file's real stat
    stored = json.loads(sums.read_text())
    stored[str(f)][4] = "0" * 64
    sums.write_text(json.dumps(stored))
    _fresh_controller_cache(monkeypatch, sums)
    assert sha256(str(f)) == "0" * 64
    # same size, mtime put back: the ctime moved, so it is hashed again
    st = os.stat(f)
    f.write_bytes(b"uv 1.0")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    _fresh_controller_cache(monkeypatch, sums)
    assert sha256(str(f)) == hashlib.sha256(b"uv 1.0").hexdigest()


def test_a_file_written_just_now_is_not_stored_and_an_unwritable_cache_still_hashes(tmp_path, monkeypatch):
    from vllm_fleet.roles.ops import sha256

    f = tmp_path / "hoststate.py"
    f.write_bytes(b"print(1)")
    _fresh_controller_cache(monkeypatch, tmp_path / "sums.json")
    assert sha256(str(f)) == hashlib.sha256(b"print(1)").hexdigest()
    assert not (tmp_path / "sums.json").exists()
    aged(f)
    _fresh_controller_cache(monkeypatch, tmp_path / "no-such-dir" / "sums.json")
    assert sha256(str(f)) == hashlib.sha256(b"print(1)").hexdigest()
