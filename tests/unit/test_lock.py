"""Locks: parsing, identity, targets, the broken-pair check, the store's file choice and the install command.

The lock excerpts under tests/fixtures/locks/ are real `uv pip compile --generate-hashes` output for
`vllm==0.33.0` from PyPI (uv 0.13.9, 2026-12-05), cut to the cuda-*, torch, vllm and CUDA runtime entries:
for Python 3.11 without a constraint, uv pairs cuda-python 12.6.2.post1 with cuda-bindings 13.5.0; with the
variant's `cuda-python>=13` (and for Python 3.13) it picks 13.4.4 for both.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from vllm_fleet.controller import locks
from vllm_fleet.core.lock import (
    IndexSettings,
    Lock,
    LockError,
    Target,
    best_file,
    broken_pairs,
    install_command,
    settings_for,
    wheel_file_tags,
)
from vllm_fleet.core.variants import load_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "locks"
UNCONSTRAINED = (FIXTURES / "vllm-0.33.0-cp311-manylinux_2_36-no-constraint-EXCERPT.txt").read_text()
CONSTRAINED = (FIXTURES / "vllm-0.33.0-cp313-manylinux_2_40-cuda-python-ge-13-EXCERPT.txt").read_text()
H1, H2, H3 = "a" * 64, "b" * 64, "c" * 64
SMALL = (f"six==1.17.0 \\\n    --hash=sha256:{H1}\n"
         f"triton==3.5.0 \\\n    --hash=sha256:{H2} \\\n    --hash=sha256:{H3}\n")


def test_a_real_lock_parses_to_one_pin_per_package_with_its_hashes():
    lock = Lock.parse(CONSTRAINED)
    torch = lock.pin("torch")
    assert torch is not None and torch.version == "2.14.0" and len(torch.hashes) > 10
    assert lock.pin("cuda_python").version == "13.4.4"  # names compare normalized
    assert lock.digest == Lock.parse(CONSTRAINED).digest and len(lock.digest) == 16
    assert lock.digest != Lock.parse(UNCONSTRAINED).digest


@pytest.mark.parametrize("text, why", [
    ("six>=1.16 \\\n    --hash=sha256:" + H1 + "\n", "exact pins"),
    ("six==1.17.0\n", "has no sha256 hash"),
    (SMALL + SMALL, "twice"),
])
def test_what_is_not_a_lock_is_refused(text, why):
    with pytest.raises(LockError, match=why):
        Lock.parse(text)


def test_excluded_packages_leave_the_lock_and_change_its_identity():
    lock = Lock.parse(SMALL)
    less = lock.without(["Triton"])
    assert [p.name for p in less.pins] == ["six"] and less.digest != lock.digest
    assert lock.without(["torchvision"]) is lock


def test_the_cuda_python_pair_uv_picks_without_the_constraint_is_refused_and_the_constrained_one_passes():
    problems = broken_pairs(Lock.parse(UNCONSTRAINED))
    assert len(problems) == 1
    assert "cuda-python 12.6.2.post1 with cuda-bindings 13.5.0" in problems[0]
    assert "cudaLibrary_t" in problems[0] and 'cuda-python>=13' in problems[0]
    assert broken_pairs(Lock.parse(CONSTRAINED)) == []


def test_every_cuda_13_row_of_the_table_carries_the_constraint_that_avoids_the_pair():
    for version, variants in load_table().items():
        for v in variants.values():
            if v.cuda and v.cuda.startswith("13"):
                assert "cuda-python>=13" in v.constraints, (version, v.name)


def test_a_cuda_build_resolved_with_torchs_cpu_build_is_refused():
    text = CONSTRAINED.replace("torch==2.14.0 ", "torch==2.14.0+cpu ")
    assert any("CPU build" in p for p in broken_pairs(Lock.parse(text)))
    assert not any("CPU build" in p for p in broken_pairs(Lock.parse(text), accelerator="cpu"))


@pytest.mark.parametrize("python, machine, glibc, key", [
    ("3.13", "x86_64", "2.41", "cp313-x86_64-manylinux_2_40-cu130"),  # Debian 13: past uv's newest
    ("3.11", "x86_64", "2.36", "cp311-x86_64-manylinux_2_36-cu130"),  # Debian 12
    ("3.10", "aarch64", "2.35", "cp310-aarch64-manylinux_2_35-cu130"),  # Ubuntu 22.04 on Grace
])
def test_a_target_is_the_hosts_python_machine_and_glibc(python, machine, glibc, key):
    assert Target.of_host(python, machine, glibc, "cu130").key == key


@pytest.mark.parametrize("python, machine, glibc, why", [
    ("3.13", "riscv64", "2.41", "machine"), ("3.11", "x86_64", "2.12", "older than manylinux2014"),
    ("", "x86_64", "2.36", "cannot tell"),
])
def test_a_target_without_wheels_is_refused(python, machine, glibc, why):
    with pytest.raises(LockError, match=why):
        Target.of_host(python, machine, glibc, "cu130")


def test_the_store_takes_the_targets_own_wheel_among_an_index_files():
    # file names of PyPI's torch 2.14.0 and six; hashes stand in for the index's
    pin = Lock.parse(f"torch==2.14.0 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H2} \\\n"
                     f"    --hash=sha256:{H3}\n").pins[0]
    files = {"torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl": H1,
             "torch-2.14.0-cp313-cp313-manylinux_2_28_x86_64.whl": H2,
             "torch-2.14.0-cp313-cp313-manylinux_2_28_aarch64.whl": H3,
             "torch-2.14.0-cp313-cp313t-manylinux_2_28_x86_64.whl": "d" * 64}
    assert best_file(files, pin, Target.of_host("3.13", "x86_64", "2.41", "cu130")) == \
        "torch-2.14.0-cp313-cp313-manylinux_2_28_x86_64.whl"
    assert best_file(files, pin, Target.of_host("3.11", "x86_64", "2.36", "cu130")) == \
        "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert best_file(files, pin, Target.of_host("3.12", "x86_64", "2.36", "cu130")) is None
    # a wheel newer than the host's glibc is not taken
    assert best_file({"torch-2.14.0-cp313-cp313-manylinux_2_39_x86_64.whl": H1}, pin,
                     Target.of_host("3.13", "x86_64", "2.36", "cu130")) is None


def test_compressed_tag_sets_and_abi3_and_old_pure_python_tags_are_understood():
    assert "py3-none-any" in wheel_file_tags("six-1.17.0-py2.py3-none-any.whl")
    assert "cp38-abi3-manylinux_2_17_x86_64" in wheel_file_tags(
        "cryptography-44.0.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    tags = Target.of_host("3.13", "x86_64", "2.41", "cu130").wheel_tags()
    assert "cp38-abi3-manylinux_2_17_x86_64" in tags and "py37-none-any" in tags


def test_the_install_is_exactly_the_lock_from_the_store_or_the_fleets_index():
    index = IndexSettings("http://10.77.0.1:18091/index/", index_strategy="unsafe-best-match",
                          find_links=("/opt/wheels",))
    py, rel = "/opt/vllm/releases/.tmp-0.33.0-cu130/bin/python", "/opt/vllm/releases/.tmp-0.33.0-cu130"
    head = ["uv", "pip", "install", "--quiet", "--python", py, "--no-deps", "--require-hashes"]
    assert install_command(py, rel, f"{rel}/.lock", index, "/var/cache/vllm-fleet/wheels") == [
        *head, "--no-index", "--find-links", "/var/cache/vllm-fleet/wheels", "-r", f"{rel}/.lock"]
    # registry mode: the controller's find-links folder is not the host's
    assert install_command(py, rel, f"{rel}/.lock", index, None) == [
        *head, "--index-url", "http://10.77.0.1:18091/index/", "--index-strategy", "unsafe-best-match",
        "-r", f"{rel}/.lock"]
    with pytest.raises(ValueError, match="refusing to install elsewhere"):
        install_command("/usr/bin/python3", rel, f"{rel}/.lock", index, None)


def test_the_fleets_index_replaces_the_variants_public_indexes():
    table = ("https://wheels.vllm.ai/0.33.0/cu129", "https://download.pytorch.org/whl/cu129")
    own = settings_for(None, table, "unsafe-best-match", {"index_url": "https://pypi.internal/simple"})
    assert own.indexes == ["https://pypi.internal/simple"] and own.index_strategy is None
    public = settings_for(None, table, "unsafe-best-match", None)
    assert public.indexes == ["https://pypi.org/simple", *table]
    skipped = settings_for(None, table, "unsafe-best-match", None, ["/opt/wheels"], public_indexes=False)
    assert skipped.indexes == ["https://pypi.org/simple"] and skipped.find_links == ("/opt/wheels",)
    assert own.key != public.key != skipped.key


def test_an_index_page_is_read_as_pep_691_json_or_pep_503_html():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/json/six/":
            return httpx.Response(200, headers={"content-type": "application/vnd.pypi.simple.v1+json"},
                                  json={"files": [{"filename": "six-1.17.0-py2.py3-none-any.whl",
                                                   "url": "../../files/six.whl", "hashes": {"sha256": H1}}]})
        if request.url.path == "/html/six/":
            return httpx.Response(200, headers={"content-type": "text/html"}, text=(
                f'<html><body><a href="/f/six-1.17.0-py2.py3-none-any.whl#sha256={H2}">'
                "six-1.17.0-py2.py3-none-any.whl</a><a href=\"/f/six-1.17.0.tar.gz\">six-1.17.0.tar.gz</a>"))
        return httpx.Response(404)

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        assert locks.index_files(client, "http://mirror/json", "six") == {
            "six-1.17.0-py2.py3-none-any.whl": ("http://mirror/files/six.whl", H1)}
        assert locks.index_files(client, "http://mirror/html/", "six") == {
            "six-1.17.0-py2.py3-none-any.whl": ("http://mirror/f/six-1.17.0-py2.py3-none-any.whl", H2)}
        assert locks.index_files(client, "http://mirror/none", "six") == {}


def _fake_uv(tmp_path: Path, lock_text: str) -> Path:
    """A uv that writes a fixed resolution to --output-file and counts its calls."""
    uv = tmp_path / "uv"
    (tmp_path / "out.txt").write_text(lock_text)
    uv.write_text("#!/bin/sh\necho x >> \"$(dirname \"$0\")/calls\"\n"
                  "while [ $# -gt 0 ]; do [ \"$1\" = --output-file ] && "
                  "cp \"$(dirname \"$0\")/out.txt\" \"$2\"; shift; done\n")
    uv.chmod(uv.stat().st_mode | stat.S_IEXEC)
    return uv


def test_a_lock_is_resolved_once_and_a_broken_resolution_is_never_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "LOCKS_DIR", tmp_path / "locks")
    target = Target.of_host("3.13", "x86_64", "2.41", "cu130")
    good = _fake_uv(tmp_path, CONSTRAINED)
    first = locks.resolve("vllm==0.33.0", target, IndexSettings(), uv=good, log=lambda _: None)
    again = locks.resolve("vllm==0.33.0", target, IndexSettings(), uv=good, log=lambda _: None)
    assert first.digest == again.digest == Lock.parse(CONSTRAINED).digest
    assert (tmp_path / "calls").read_text().count("x") == 1
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = _fake_uv(bad_dir, UNCONSTRAINED)
    for _ in range(2):
        with pytest.raises(LockError, match="break each other"):
            locks.resolve("vllm==0.33.0", Target.of_host("3.11", "x86_64", "2.36", "cu130"),
                          IndexSettings(), uv=bad, log=lambda _: None)
    assert (bad_dir / "calls").read_text().count("x") == 2  # not cached: asked again
    assert not any("cp311" in p.name for p in (tmp_path / "locks").iterdir())
    assert os.listdir(tmp_path / "locks") == [locks.lock_path("vllm==0.33.0", target, IndexSettings()).name]


def test_a_lock_folder_in_the_operators_repository_is_where_locks_are_kept(tmp_path, monkeypatch):
    import importlib

    monkeypatch.setenv("VLLM_FLEET_LOCKS", str(tmp_path / "repo-locks"))
    try:
        assert tmp_path / "repo-locks" == importlib.reload(locks).LOCKS_DIR
    finally:
        monkeypatch.delenv("VLLM_FLEET_LOCKS")
        importlib.reload(locks)
    assert locks.LOCKS_DIR.name == "locks" and tmp_path / "repo-locks" != locks.LOCKS_DIR


def test_a_changed_constraint_is_another_lock():
    target, index = Target.of_host("3.13", "x86_64", "2.41", "cu130"), IndexSettings()
    assert locks.lock_path("vllm==0.33.0", target, index, ["cuda-python>=13"]) != \
        locks.lock_path("vllm==0.33.0", target, index, [])
    assert locks.lock_path("vllm==0.33.0", target, index, ["a", "b"]) == \
        locks.lock_path("vllm==0.33.0", target, index, ["b", "a"])
