"""Issue 15 on real hosts: the lab logs in as `deploy` with passwordless sudo (lab2 as root), host keys
verified; logins that cannot become root without a password are refused before anything changes.

The refused logins are made on lab1 for this module only: `nosudo` (no sudo rights), `pwsudo` (sudo
with a password, which pyinfra would prompt for and then pass in argv), and `deploy` without `_sudo`.
"""

from __future__ import annotations

import pytest

import fleetlab as lab
from fleetlab.inventory import connection
from tests.hosts.conftest import deploy, host_files_digest, on, unit_props

USERS = ("nosudo", "pwsudo")


@pytest.fixture(scope="module")
def logins(deployed):
    pub = lab.ssh_key().with_suffix(".pub").read_text().strip()
    made = [f"id -u {u} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {u}; "
            f"install -d -m 700 -o {u} -g {u} /home/{u}/.ssh; echo '{pub}' > /home/{u}/.ssh/authorized_keys; "
            f"chown {u}:{u} /home/{u}/.ssh/authorized_keys; chmod 600 /home/{u}/.ssh/authorized_keys"
            for u in USERS]
    on("lab1", "; ".join(made) + "; echo 'pwsudo:lab-only-pw' | chpasswd; "
               "echo 'pwsudo ALL=(ALL) ALL' > /etc/sudoers.d/pwsudo; chmod 440 /etc/sudoers.d/pwsudo")
    yield
    on("lab1", "rm -f /etc/sudoers.d/pwsudo; " + "; ".join(f"userdel -r {u} 2>/dev/null" for u in USERS))


def test_lab_connects_as_deploy_with_sudo_and_verified_host_keys(deployed):
    for name in ("lab1", "lab2"):
        data = connection(lab.LabHost(int(name[3:])))
        assert data["ssh_strict_host_key_checking"] == "yes"
        assert data["ssh_known_hosts_file"] == str(lab.KNOWN_HOSTS)
    assert connection(lab.LabHost(1))["ssh_user"] == "deploy" and connection(lab.LabHost(1))["_sudo"]
    assert connection(lab.LabHost(2))["ssh_user"] == "root"  # the root-login path stays tested
    assert "No host key" not in deployed.output and "Added host key" not in deployed.output
    # the deploy user really is an ordinary user, and what its sudo ran is in the host's journal
    assert on("lab1", "id -u deploy").strip() != "0"
    assert "COMMAND=" in on("lab1", "journalctl SYSLOG_IDENTIFIER=sudo --no-pager -o cat | grep -m1 deploy")
    # uploads of the sudo login went through its own 0700 directory that root made beside the models
    # (not through /home, which a large model would fill), and nothing stayed there
    assert on("lab1", "stat -c %a:%U /opt/vllm/.upload /opt/vllm/.upload/deploy").split() == \
        ["711:root", "700:deploy"]
    assert on("lab1", "ls -A /opt/vllm/.upload/deploy /etc/vllm/.staging").split() == \
        ["/etc/vllm/.staging:", "/opt/vllm/.upload/deploy:"]


def test_a_host_key_that_changed_is_refused(deployed):
    """Strict checking is on: lab1's address answering with a key the known_hosts file does not hold
    for it (here: lab2's real keys recorded under lab1's address) is refused before pyinfra runs
    anything there."""
    known = lab.KNOWN_HOSTS.read_text()
    lines = known.splitlines()
    forged = [line for line in lines if not line.startswith("10.77.1.2 ")]
    forged += [line.replace("10.77.2.2 ", "10.77.1.2 ", 1) for line in lines if line.startswith("10.77.2.2 ")]
    try:
        lab.KNOWN_HOSTS.write_text("\n".join(forged) + "\n")
        run = deploy(limit="lab1")
    finally:
        lab.KNOWN_HOSTS.write_text(known)
    assert run.rc != 0
    assert "lab1" in run.output and "Beginning operation run" not in run.output


@pytest.mark.parametrize(("login", "says"), [
    ({"ssh_user": "nosudo"}, "the login 'nosudo' cannot become root without a password"),
    ({"ssh_user": "pwsudo"}, "the login 'pwsudo' cannot become root without a password"),
    ({"_sudo": False}, "the login 'deploy' is not root and `_sudo` is not set"),
    ({"_sudo_password": "lab-only-pw", "ssh_user": "pwsudo"}, "_sudo_password: refused: pyinfra passes"),
], ids=["no-sudo-rights", "sudo-wants-a-password", "no-_sudo", "_sudo_password"])
@pytest.mark.parametrize("entry", ["deploys/vllm.py", "deploys/smoke.py", "deploys/rollback.py"])
def test_a_login_that_cannot_become_root_is_refused_before_anything_changes(logins, login, says, entry):
    before = {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in ("lab1", "lab2")}
    run = deploy(entry, overrides={"__hostdata__": {"lab1": login}, "lab1": {"flags": {"max_num_seqs": 7}}})
    assert run.rc != 0
    line = next((x.strip() for x in run.output.splitlines() if x.strip().startswith("lab1: ")), "")
    assert says in line, run.output[-3000:]
    if "cannot become root" in says:
        user = login["ssh_user"]
        assert f"`{user} ALL=(root) NOPASSWD: ALL` in /etc/sudoers.d/vllm-fleet" in line
    assert "] sudo password:" not in run.output  # never prompted (pyinfra's "[host] sudo password: ")
    assert "Beginning operation run" not in run.output
    assert {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in ("lab1", "lab2")} == before
