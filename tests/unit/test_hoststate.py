"""hoststate.py (runs on hosts) against a temporary root: commit, restore, toggle, prune, refusals."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest


@pytest.fixture()
def hs(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_ROOT", str(tmp_path))
    import fleet.hoststate as mod

    mod = importlib.reload(mod)
    for d in ("etc/vllm", "etc/systemd/system", "opt/vllm/releases", "var/lib/vllm-fleet"):
        (tmp_path / d).mkdir(parents=True)
    yield mod, tmp_path
    monkeypatch.delenv("VLLM_FLEET_ROOT")
    importlib.reload(mod)


def deploy(root: Path, release: str, config: str, key: str = "k1") -> None:
    """What the deploy role leaves on a host: a release, the current link and the three files."""
    (root / "opt/vllm/releases" / release).mkdir(exist_ok=True)
    link = root / "opt/vllm/current"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f"releases/{release}")
    (root / "etc/vllm/default.yaml").write_text(config)
    (root / "etc/vllm/default.env").write_text(f'VLLM_API_KEY="{key}"\n')
    (root / "etc/systemd/system/vllm-default.service").write_text("[Service]\n")


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


def test_prune_removes_only_models_no_current_or_previous_config_uses(hs):
    mod, root = hs
    models = root / "var/lib/vllm/models"
    for m in ("old", "prev", "cur"):
        (models / m).mkdir(parents=True)
    deploy(root, "0.31.0-cpu", "model: /var/lib/vllm/models/prev\n")
    mod.commit("0.31.0-cpu")
    deploy(root, "0.32.0-cpu", "model: /var/lib/vllm/models/cur\n")
    mod.commit("0.32.0-cpu")
    out = mod.prune(3)
    assert out["models_removed"] == ["old"]
    assert sorted(os.listdir(models)) == ["cur", "prev"]


def test_prune_keeps_a_model_a_config_names_by_a_path_inside_it(hs):
    """host_path `.../models/llama/v2` (or with a trailing slash) uses `llama`: comparing last path
    components removed it."""
    mod, root = hs
    models = root / "var/lib/vllm/models"
    for m in ("llama/v2", "chat", "old"):
        (models / m).mkdir(parents=True)
    deploy(root, "0.31.0-cpu", "model: /var/lib/vllm/models/chat/\n")
    mod.commit("0.31.0-cpu")
    deploy(root, "0.32.0-cpu", "model: /var/lib/vllm/models/llama/v2\n")
    mod.commit("0.32.0-cpu")
    assert mod.prune(3)["models_removed"] == ["old"]
    assert sorted(os.listdir(models)) == ["chat", "llama"]


def test_prune_removes_a_planted_link_itself_never_what_it_points_at(hs, tmp_path_factory):
    mod, root = hs
    victim = tmp_path_factory.mktemp("victim")
    (victim / "precious").mkdir()
    models = root / "var/lib/vllm/models"
    models.mkdir(parents=True)
    (models / "evil").symlink_to(victim)
    deploy(root, "0.32.0-cpu", "model: /var/lib/vllm/models/cur\n")
    mod.commit("0.32.0-cpu")
    assert mod.prune(3)["models_removed"] == ["evil"]
    assert (victim / "precious").is_dir() and not (models / "evil").exists()


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
