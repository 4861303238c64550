"""Lab hosts on two Debian releases: each suite has its own cached root and base, bookworm keeps the cache
names labs made before suites existed, the state file remembers each host's suite, and stage hosts stay
out of the lab's default inventory. Booting them is proven on real hosts, not here."""

from __future__ import annotations

import json

import pytest

import fleetlab as lab
import fleetlab.inventory as inventory


def test_bookworm_keeps_its_cache_names_and_trixie_gets_its_own():
    assert lab.rootfs_tarball().name == "lab-rootfs-bookworm-r2.tar.zst"
    assert lab.rootfs_tarball("bookworm") == lab.rootfs_tarball()
    assert lab.rootfs_tarball("trixie").name == "lab-rootfs-trixie-r2.tar.zst"
    assert lab.base_dir() == lab.LAB_DIR / "base-r2"
    assert lab.base_dir("trixie") == lab.LAB_DIR / "base-trixie-r2"


def test_an_unknown_suite_is_refused_before_anything_is_built():
    with pytest.raises(lab.LabError, match="sid"):
        lab.build_rootfs(suite="sid")


def test_only_trixie_hosts_get_a_unified_cgroup_tree():
    assert lab.nspawn_env("bookworm") == {}
    assert lab.nspawn_env("trixie") == {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def test_state_round_trip_keeps_role_and_suite(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "LAB_DIR", tmp_path)
    hosts = [lab.LabHost(1), lab.LabHost(5, "stage", "trixie"), lab.LabHost(8, "plain")]
    lab.write_state(hosts)
    assert lab.read_state() == hosts
    assert json.loads((tmp_path / "hosts.json").read_text())["hosts"][1]["suite"] == "trixie"


def test_state_from_before_suites_reads_as_bookworm(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "LAB_DIR", tmp_path)
    (tmp_path / "hosts.json").write_text(json.dumps(
        {"hosts": [{"name": "lab1", "address": "10.77.1.2", "role": "vllm"}, {"name": "lab8"}]}))
    assert lab.read_state() == [lab.LabHost(1), lab.LabHost(8, "vllm", "bookworm")]


def test_a_running_host_of_another_suite_or_kind_is_never_taken_for_the_wanted_one():
    running = [lab.LabHost(1), lab.LabHost(5, "stage", "trixie"), lab.LabHost(7, "plain")]
    assert lab._clashes([lab.LabHost(5, "stage", "trixie")], running) == []
    assert lab._clashes([lab.LabHost(5, "stage", "bookworm")], running) == [running[1]]
    assert lab._clashes([lab.LabHost(1, "stage", "bookworm")], running) == [running[0]]
    assert lab._clashes([lab.LabHost(5)], running) == [running[1]]
    assert lab._clashes([lab.LabHost(7)], running) == []  # plain relabelled as before suites


def test_up_stage_refuses_indexes_outside_the_small_hosts(monkeypatch):
    monkeypatch.setattr(lab, "preflight", lambda: None)
    for bad in ([], [0], [lab.PLAIN_FIRST], [lab.LIGHT_FIRST]):
        with pytest.raises(lab.LabError):
            lab.up_stage(bad)


def test_stage_hosts_stay_out_of_the_default_inventory(monkeypatch):
    monkeypatch.setattr(lab, "read_state", lambda: [
        lab.LabHost(1), lab.LabHost(5, "stage", "trixie"), lab.LabHost(8, "plain"),
        lab.LabHost(20, "light")])
    hosts = dict(inventory.lab_hosts())
    assert sorted(hosts) == ["lab1", "lab20", "lab8"]
    assert "vllm" in hosts["lab1"] and "vllm" in hosts["lab20"] and "vllm" not in hosts["lab8"]


def test_summary_names_each_role_present():
    hosts = [lab.LabHost(1), lab.LabHost(2), lab.LabHost(5, "stage", "trixie"), lab.LabHost(8, "plain")]
    assert lab.summary(hosts) == "2 vLLM host(s) and 1 plain host(s) and 1 stage host(s)"
    assert lab.summary([lab.LabHost(5, "stage", "trixie")]) == "0 vLLM host(s) and 1 stage host(s)"
