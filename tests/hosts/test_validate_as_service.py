"""The host check runs as the service will (#34 item 4): the vllm user, in the unit's own sandbox and
environment, as a transient unit (vllm_fleet/host/validate_in_unit.py). Checked as root, a chat template
only root can read was accepted and the restarted service died on it; and root's torch import read
/tmp, where the vllm user can plant what it likes."""

from __future__ import annotations

from tests.hosts.conftest import deploy, host_files_digest, on, remote_code_model, unit_props

ROOT_ONLY = "/etc/vllm-fleet-test/root-only.jinja"
READABLE = "/etc/vllm-fleet-test/chat.jinja"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _files(host: str) -> None:
    on(host, f"install -d -m 755 /etc/vllm-fleet-test && printf %s {TEMPLATE!r} > {ROOT_ONLY} "
             f"&& chmod 600 {ROOT_ONLY} && printf %s {TEMPLATE!r} > {READABLE} && chmod 644 {READABLE}")


def test_a_file_the_service_cannot_read_is_refused_before_the_restart(deployed):
    """A template only root can read, and a tokenizer in a directory the vllm user cannot enter: both
    exist (root reads them), both are named, and the old process goes on serving."""
    host = "lab1"
    _files(host)
    on(host, "install -d -m 700 /etc/vllm-fleet-test/closed")
    before, files = unit_props(host), host_files_digest(host)
    assert before["ActiveState"] == "active", before
    run = deploy(overrides={host: {"flags": {"extra_args": {
        "chat-template": ROOT_ONLY, "tokenizer": "/etc/vllm-fleet-test/closed"}}}}, limit=host)
    assert run.rc != 0, run.output[-3000:]
    assert (f"the service could not use what these name, as user vllm: chat-template: {ROOT_ONLY}: the "
            "service's user cannot read it (Permission denied); tokenizer: /etc/vllm-fleet-test/closed: the "
            "service's user cannot read it (Permission denied)") in run.output, run.output[-3000:]
    assert "nothing switched" in run.output
    after = unit_props(host)
    assert (after["ActiveState"], after["MainPID"]) == ("active", before["MainPID"])  # never restarted
    assert host_files_digest(host) == files


def test_a_model_the_service_cannot_find_is_refused_before_the_restart(deployed):
    """A model directory that is not on the host: refused by the check, not by the restarted service."""
    host = "lab1"
    before = unit_props(host)
    run = deploy(overrides={host: {"model": {"path": None, "host_path": "/opt/vllm/models/not-there"}}},
                 limit=host)
    assert run.rc != 0, run.output[-3000:]
    assert ("the service could not use its model, as user vllm: /opt/vllm/models/not-there: not found "
            "where the service runs") in run.output, run.output[-3000:]
    after = unit_props(host)
    assert (after["ActiveState"], after["MainPID"]) == ("active", before["MainPID"])


def test_a_remote_code_models_code_runs_in_the_check_as_the_service(deployed):
    """trust_remote_code: building the engine config imports the model's own code. Run as root, the check
    left that to the restarted service; run as the service, it runs it there first. A model whose code
    fails is refused before the restart, by the code's own error, which names the uid it ran as."""
    host = "lab1"
    path = remote_code_model(host)
    uid = on(host, "id -u vllm").strip()
    assert uid != "0"
    before = unit_props(host)
    run = deploy(deploy_file="deploys/stage.py", limit=host, overrides={host: {
        "model": {"path": None, "host_path": path}, "flags": {"trust_remote_code": True}}})
    assert run.rc != 0, run.output[-3000:]
    # the code's own error, as vLLM's check words it: the exception's class, then its message
    said = f"vLLM would refuse to start: RuntimeError: the model code ran as uid {uid}"
    assert said in run.output, run.output[-3000:]
    after = unit_props(host)
    assert (after["ActiveState"], after["MainPID"]) == ("active", before["MainPID"])


def test_what_the_vllm_user_plants_in_tmp_reaches_no_check(deployed):
    """`vllm-fleet stage`'s check of a changed config, with a template the service can read, while the
    vllm user holds torch's compile-cache names in the host's /tmp as files: root's torch import stops
    on its own (FileExistsError in torch/_inductor/runtime/cache_dir_utils.py, tried on this lab), so a
    check run as root failed on every host the vllm user did this on. The check runs as that user in the
    unit's own /tmp: it passes, and nothing is restarted."""
    host = "lab1"
    _files(host)
    names = "/tmp/torchinductor_root /tmp/torchinductor_vllm"
    # root's own, from checks run as root before; and the mark of an earlier pass of this very config
    on(host, f"rm -rf {names} /var/lib/vllm-fleet/staged/default.validated")
    on(host, f"runuser -u vllm -- sh -c 'for f in {names}; do echo planted > $f; done'")
    before = unit_props(host)
    try:
        run = deploy(deploy_file="deploys/stage.py", limit=host, overrides={host: {"flags": {
            "max_num_seqs": 5, "extra_args": {"chat-template": READABLE}}}})
        assert run.rc == 0, run.output[-3000:]
        assert "accepted (parser and engine config)" in run.output, run.output[-3000:]
        assert on(host, "stat -c %U:%F /tmp/torchinductor_root").strip() == "vllm:regular file"  # as planted
        assert on(host, "cat /var/lib/vllm-fleet/staged/default.yaml.at-default").startswith("{")
        assert on(host, "ls /run/vllm-fleet/validate").strip() == ""  # nothing left behind
        after = unit_props(host)
        assert (after["ActiveState"], after["MainPID"]) == ("active", before["MainPID"])
    finally:
        on(host, f"rm -f {names}")
