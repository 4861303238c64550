"""Hub models through a real Hugging Face-compatible mirror: olah (from PyPI) on the controller, offline,
serving the tiny model as a git repository with two revisions (fleetlab/hubmirror.py).

HOST switches from its staged model to `hf_repo` models here; the module puts it back at the end. It is
lab2 (the root login) so the modules after this one find lab1 as they expect; with HOST = "lab2" (`deploy`
with sudo: the token through that login's own upload directory, fetch and HubCache fact through its
sudo) the module passes as well.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import fleetlab as lab
from fleetlab import hubmirror
from fleetlab.probe import HealthPoll, slow_link
from tests.hosts.conftest import deploy, host_files_digest, on, unit_props

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

HOST = "lab2"
TOKEN_VAR = "FLEET_HF_TOKEN"
TOKEN = "hf_labtoken_5e1f0c9d2b7a4e63"  # what must never show up anywhere but the 0600 token file
CACHE = "/var/lib/vllm/hf/hub/models--fleetlab--tiny-llama"
LAB_HOST = lab.LabHost(int(HOST.removeprefix("lab")))


@pytest.fixture(scope="module")
def mirror(deployed):
    m = hubmirror.start(lab.LAB_DIR / "hub")
    on(HOST, f"rm -rf {CACHE}")  # what an earlier session fetched would spare the first test its fetch
    yield m
    m.stop()
    hubmirror.cut_off(LAB_HOST, cut=False)
    run = deploy(limit=HOST)  # back on its staged model for the modules after this one
    assert run.rc == 0, run.output[-4000:]


def hub_model(m: hubmirror.Mirror, revision: str, repo: str | None = None, token: bool = True) -> dict:
    over = {"hf_endpoint": m.url,
            "model": {"name": "tiny-llama", "path": None, "hf_repo": repo or m.repo, "revision": revision}}
    if token:
        over["hf_token_env"] = TOKEN_VAR
    return {HOST: over}


def hub_deploy(m: hubmirror.Mirror, revision: str, **kw):
    return deploy(overrides=hub_model(m, revision, **kw.pop("model", {})), env={TOKEN_VAR: TOKEN},
                  limit=HOST, **kw)


def served_model_dir() -> str:
    return next(line.split(":", 1)[1].strip().strip("'\"") for line in on(HOST, "cat /etc/vllm/default.yaml")
                .splitlines() if line.startswith("model:"))


def unix_ts(prop: str) -> float:
    out = on(HOST, f"systemctl show --timestamp=unix -p {prop} vllm-default.service").strip()
    return float(out.split("=@", 1)[1])


def test_a_hub_model_is_fetched_before_the_restart_and_served_offline(mirror):
    old_pid = unit_props(HOST)["MainPID"]
    old_since = unix_ts("ActiveEnterTimestamp")
    poll = HealthPoll(LAB_HOST)
    poll.start()
    try:
        with slow_link(LAB_HOST, "4mbit"):  # the tiny model's 1.9 MB take seconds, as real weights do
            run = hub_deploy(mirror, "v1", extra=("-vvv",))
    finally:
        samples = poll.stop()
    assert run.rc == 0, run.output[-6000:]
    sha = mirror.shas[0]
    snap = f"{CACHE}/snapshots/{sha}"
    assert served_model_dir() == snap  # the tag resolved to its commit at plan time
    assert 'HF_HUB_OFFLINE="1"' in on(HOST, "cat /etc/vllm/default.environment")
    # fetched before the restart: every blob was written while the old process was still serving
    # (active since before the deploy, stopped only after the last blob landed)
    blobs = [float(t) for t in on(HOST, f"stat -c %.9Y {CACHE}/blobs/*").split()]
    stopped = unix_ts("InactiveEnterTimestamp")
    # (systemd's unix timestamps are whole seconds, truncated)
    assert blobs and old_since < min(blobs) and int(max(blobs)) <= stopped, (old_since, blobs, stopped)
    # and the old service answered all through the fetch
    during = [code for t, code in samples if min(blobs) <= t <= max(blobs)]
    assert len(during) >= 5 and set(during) == {"200"}, (blobs, samples)
    assert unit_props(HOST)["MainPID"] != old_pid
    fetch_at = run.output.index(f"fetch fleetlab/tiny-llama@v1 = {sha[:12]}")
    assert fetch_at < run.output.index("restart vllm-default.service")
    assert "verified 6 files" in run.output  # hubfetch's last progress line, live in pyinfra's output
    assert [r["ok"] for r in run.smoke] == [True]
    print("\n".join(line for line in run.output.splitlines() if "fetch fleetlab" in line))
    # the cache is the vllm user's; the token file root's alone
    assert on(HOST, f"stat -c %U {snap}/config.json -L").strip() == "vllm"
    assert on(HOST, "stat -c '%U %a' /etc/vllm/default.hub.env").strip() == "root 600"
    # the token: only in that file, never in argv, unit, config, the vllm user's home and cache, output at
    # -vvv, journal or sudo's log
    assert TOKEN not in run.output
    leaks = on(HOST, f"grep -rl {TOKEN} /etc/systemd /etc/vllm /var/lib/vllm-fleet /var/lib/vllm /var/log "
                     f"/root /home /tmp /opt/vllm/.upload 2>/dev/null; "
                     f"journalctl --no-pager -o cat | grep -c {TOKEN}")
    assert leaks.split() == ["/etc/vllm/default.hub.env", "0"], leaks
    # a rerun fetches nothing and changes nothing
    again = hub_deploy(mirror, "v1")
    assert again.rc == 0, again.output[-4000:]
    assert again.changed_ops() == [], again.changed_ops()
    assert "fetch fleetlab" not in again.output


def test_a_revision_change_rolls_out_and_rolls_back_offline(mirror):
    run = hub_deploy(mirror, "main")
    assert run.rc == 0, run.output[-6000:]
    assert served_model_dir().endswith(mirror.shas[1])
    mirror.stop()  # the hub is gone: the rollback needs only what the host has
    try:
        # the same inventory as the deploy's, naming the hub that is now down
        back = deploy("deploys/rollback.py", overrides=hub_model(mirror, "main"), env={TOKEN_VAR: TOKEN},
                      limit=HOST)
        assert back.rc == 0, back.output[-6000:]
        assert served_model_dir().endswith(mirror.shas[0])
        assert [r["ok"] for r in back.smoke] == [True]
        # prune kept what current and previous name, nothing else
        kept = sorted(on(HOST, f"ls {CACHE}/snapshots").split())
        assert kept == sorted(mirror.shas)
    finally:
        restarted = hubmirror.start(mirror.workdir)
        assert restarted.url == mirror.url and restarted.shas == mirror.shas
        mirror.process = restarted.process
    # back to the staged model: its commit's prune (as the vllm user) keeps only what previous names
    run = deploy(limit=HOST)
    assert run.rc == 0, run.output[-4000:]
    assert on(HOST, f"ls {CACHE}/snapshots").split() == [mirror.shas[0]]


def test_unknown_repository_or_revision_is_refused_at_plan_time(mirror):
    before = host_files_digest(HOST)
    run = hub_deploy(mirror, "no-such-tag")
    assert run.rc != 0
    assert (f"{HOST}: vllm.instances[default].model.revision: 'no-such-tag' is not a branch, tag or "
            f"commit of {mirror.repo} at {mirror.url}") in run.output, run.output[-3000:]
    run = hub_deploy(mirror, "main", model={"repo": "fleetlab/no-such-model"})
    assert run.rc != 0
    assert (f"{HOST}: vllm.instances[default].model.hf_repo: fleetlab/no-such-model at {mirror.url}"
            in run.output)
    assert host_files_digest(HOST) == before


def test_a_host_cut_off_from_the_mirror_fails_before_any_restart(mirror):
    on(HOST, f"rm -rf {CACHE}/snapshots/{mirror.shas[1]}")  # so the change must fetch
    before_pid, before_model = unit_props(HOST)["MainPID"], served_model_dir()
    hubmirror.cut_off(LAB_HOST)
    try:
        run = hub_deploy(mirror, mirror.shas[1])  # resolved on the controller, which still reaches it
    finally:
        hubmirror.cut_off(LAB_HOST, cut=False)
    assert run.rc != 0
    assert f"fetch of fleetlab/tiny-llama@{mirror.shas[1][:12]} failed, nothing restarted" in run.output
    assert (unit_props(HOST)["MainPID"], served_model_dir()) == (before_pid, before_model)
    assert unit_props(HOST)["ActiveState"] == "active"


def test_too_little_disk_for_the_snapshot_is_refused(mirror):
    before = host_files_digest(HOST)
    on(HOST, "mkdir -p /var/lib/vllm/hf && mount -t tmpfs -o size=1m,mode=750,uid=$(id -u vllm),"
             "gid=$(id -g vllm) tmpfs /var/lib/vllm/hf")
    try:
        run = hub_deploy(mirror, mirror.shas[1])
    finally:
        on(HOST, "umount /var/lib/vllm/hf")
    assert run.rc != 0
    line = next((ln for ln in run.output.splitlines() if "needs" in ln and "free there" in ln), "")
    assert f"{HOST}: vllm.instances[default].model: fetching fleetlab/tiny-llama@{mirror.shas[1][:12]} " \
           "needs 1.9 MiB in /var/lib/vllm/hf, 1.0 MiB free there" in line, run.output[-3000:]
    assert host_files_digest(HOST) == before
    print(line.strip())


def test_the_mirror_is_what_huggingface_hub_reads(mirror):
    """The lab's mirror answers the hub API the controller uses (a check of the lab, not the product)."""
    out = subprocess.run(["curl", "-sf", f"{mirror.url}/api/models/{mirror.repo}/revision/v1"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["sha"] == mirror.shas[0]
