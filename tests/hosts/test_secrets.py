"""Issue 7 on real hosts: a key from the controller's environment that never leaks, rotation through
real HTTP, and units that systemd itself verifies and scores."""

from __future__ import annotations

import secrets
import subprocess

import pytest

import fleetlab as lab
from fleetlab.inventory import connection
from tests.hosts.conftest import ROOT, api_get, deploy, on, unit_props
from tests.rendered_units import render_units

# made at run time, so the probe is in no file (this test's source included) unless the toolkit put it there
DISTINCT = "vf-leak-probe-" + secrets.token_hex(12)
ROTATED = "vf-rotated-key-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def leak_run(deployed):
    """A deploy with a distinctive key at pyinfra's most verbose, then everything searched for it."""
    run = deploy(env={"VLLM_API_KEY": DISTINCT}, extra=("-vvv",))
    assert run.rc == 0, run.output[-4000:]
    return run


def test_key_never_leaks(leak_run, lab_hosts):
    assert DISTINCT not in leak_run.output  # pyinfra's output at -vvv
    for h in lab_hosts:
        # every file of the host except the env file itself (and the immutable releases, /proc, /sys)
        hits = on(h, f"grep -rlF '{DISTINCT}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                     "--exclude-dir=releases 2>/dev/null; true").split()
        assert hits == ["/etc/vllm/default.env"], hits
        assert on(h, "stat -c %a:%U:%G /etc/vllm/default.env").strip() == "600:root:root"
        assert DISTINCT not in on(h, "ps -eo args")
        assert DISTINCT not in on(h, "journalctl --no-pager -o cat")
        # sudo logs every command line it runs: the deploy login's hosts have many, none with the key
        if connection(lab.LabHost(int(h[3:]))).get("_sudo"):
            sudo_log = on(h, "journalctl SYSLOG_IDENTIFIER=sudo --no-pager -o cat; cat /var/log/auth.log "
                             "/var/log/secure 2>/dev/null; true")
            assert sudo_log.count("COMMAND=") > 20, sudo_log[-2000:]
            assert DISTINCT not in sudo_log
        assert on(h, "ls -A /etc/vllm/.staging").strip() == ""
    # the toolkit's own files on the controller: the checkout, its caches, the lab's state
    for where in (ROOT, lab.CACHE_DIR, lab.LAB_DIR / "hosts.json"):
        out = subprocess.run(["grep", "-rlF", DISTINCT, str(where), "--exclude-dir=root",
                              "--exclude-dir=upper"], capture_output=True, text=True)
        assert out.stdout == "", out.stdout


def test_rotation_restarts_and_only_the_new_key_works(leak_run, lab_hosts):
    before = {h: unit_props(h)["MainPID"] for h in lab_hosts}
    run = deploy(env={"VLLM_API_KEY": ROTATED})
    assert run.rc == 0, run.output[-4000:]
    for h in lab_hosts:
        assert unit_props(h)["MainPID"] != before[h]
        assert api_get(h, "/v1/models", key=DISTINCT)[0] == 401
        assert api_get(h, "/v1/models", key=ROTATED)[0] == 200


def test_empty_key_variable_is_refused_naming_it(deployed):
    run = deploy(env={"VLLM_API_KEY": ""})
    assert run.rc != 0
    assert "VLLM_API_KEY is not set (or empty)" in run.output
    assert "Beginning operation run" not in run.output


def test_network_bind_without_key_is_refused(deployed):
    run = deploy(overrides={"lab1": {"api_key_env": None, "flags": {"host": "0.0.0.0"}}})
    assert run.rc != 0
    assert "lab1: vllm.instances[default].flags.host: 0.0.0.0 is reachable from the network and no API " \
           "key is set" in run.output
    assert "Beginning operation run" not in run.output


@pytest.mark.parametrize("kind", ["cpu", "gpu", "cluster-worker"])
def test_units_pass_systemd_analyze_verify_on_a_lab_root(deployed, kind):
    root = lab.LabHost(1).root
    unit = root / "etc/systemd/system" / f"vllm-verify{kind}.service"
    unit.write_text(render_units()[kind])
    try:
        out = subprocess.run(["systemd-analyze", "verify", "--recursive-errors=yes", f"--root={root}",
                              f"/etc/systemd/system/{unit.name}"], capture_output=True, text=True)
    finally:
        unit.unlink()
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr
