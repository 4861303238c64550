"""Which logins may deploy (roles/remote.py, login_problem): pure, from the LoginAccess fact's
answer and
the host's resolved connector arguments. The lab proves each on real sshd and sudo (test_logins.py)."""

from __future__ import annotations

import pytest

from vllm_fleet.roles.remote import LoginAccess, login_problem

ROOT = {"user": "root", "uid": 0, "home": "/root", "sudo": "root", "sudo_says": ""}
DEPLOY = {"user": "deploy", "uid": 1000, "home": "/home/deploy", "sudo": "ok", "sudo_says": "0"}
SUDO = {"_sudo": True}


def test_fact_reads_what_the_host_printed():
    fact = LoginAccess()
    assert fact.process(["user deploy", "uid 1000", "home /home/deploy", "sudo ok 0"]) == DEPLOY
    no = fact.process(["user nosudo", "uid 1001", "home /home/nosudo",
                       "sudo no sudo: a password is required"])
    assert (no["sudo"], no["sudo_says"]) == ("no", "sudo: a password is required")
    # sudo ran, but not as root (a sudoers rule for another target user): not good enough
    assert fact.process(["user d", "uid 5", "home /h", "sudo ok 33"])["sudo"] == "no"


@pytest.mark.parametrize(("login", "args"), [(ROOT, {}), (DEPLOY, SUDO), (ROOT, SUDO),
                                             (DEPLOY, {**SUDO, "_sudo_user": "root"})])
def test_logins_that_can_deploy(login, args):
    assert login_problem("gpu-01", login, args) is None


@pytest.mark.parametrize(("login", "args", "words"), [
    (DEPLOY, {}, "the login 'deploy' is not root and `_sudo` is not set"),
    ({**DEPLOY, "sudo": "no", "sudo_says": "sudo: a password is required"}, SUDO,
     "cannot become root without a password (sudo: a password is required)"),
    ({**DEPLOY, "sudo": "absent"}, SUDO, "sudo is not installed"),
    (DEPLOY, {**SUDO, "_sudo_password": "pw"}, "_sudo_password: refused"),
    (DEPLOY, {**SUDO, "_use_sudo_password": True}, "_use_sudo_password: refused"),
    (DEPLOY, {**SUDO, "_sudo_user": "vllm"}, "_sudo_user: 'vllm': the vLLM deploy needs root"),
    (DEPLOY, {"_su_user": "root"}, "_su_user: only sudo is supported"),
    (DEPLOY, {"_doas": True}, "_doas: only sudo is supported"),
])
def test_logins_that_cannot_are_named_with_the_fix(login, args, words):
    problem = login_problem("gpu-01", login, args)
    assert problem is not None and problem.startswith("gpu-01: ") and words in problem, problem
    if "password" in words and "refused" not in words:
        assert "`deploy ALL=(root) NOPASSWD: ALL` in /etc/sudoers.d/vllm-fleet" in problem
