"""vllm_fleet/host/effective.py against a real start-up log: captured from lab1's journal (vLLM 0.32.0, CPU
build,
the tiny model) together with the config file it was started from (tests/fixtures/startup_logs/)."""

from __future__ import annotations

from pathlib import Path

import yaml

from vllm_fleet.host import effective

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "startup_logs"
LOG = (FIX / "vllm-0.32.0-cpu-lab1.log").read_text().splitlines()
CONFIG = yaml.safe_load((FIX / "vllm-0.32.0-cpu-lab1.yaml").read_text())


def test_both_lines_are_found_and_parsed() -> None:
    args, engine = effective.from_log(LOG)
    assert args["max_num_seqs"] == 8 and args["served_model_name"] == ["tiny-llama"]
    assert engine["max_seq_len"] == "512"
    assert engine["enable_prefix_caching"] == "True"
    assert engine["dtype"] == "torch.bfloat16"
    # nested reprs with ", " inside stay one value
    assert engine["structured_outputs_config"].startswith("StructuredOutputsConfig(backend='auto', ")
    assert engine["model"] == "'/var/lib/vllm/models/tiny-llama'"


def test_the_config_it_started_from_is_in_effect() -> None:
    problems, confirmed = effective.check_log(CONFIG, LOG)
    assert problems == []
    # all but port 8000: vLLM's own default, so not among the non-default args (the host check
    # compared it before the restart)
    assert confirmed == len(CONFIG) - 1


def test_a_plain_false_is_caught_as_not_in_effect() -> None:
    """The bug this module exists for: `enable-prefix-caching: false` in the file, prefix caching on in
    the engine (vLLM's config loader dropped the false)."""
    problems, _ = effective.check_log({**CONFIG, "enable-prefix-caching": False}, LOG)
    assert problems == ["enable-prefix-caching: the plan says False, vLLM runs with True"]
    problems, _ = effective.check_log({**CONFIG, "no-enable-prefix-caching": True}, LOG)
    assert problems == ["enable-prefix-caching: the plan says False, vLLM runs with True"]


def test_values_off_the_engine_line_come_from_the_non_default_args() -> None:
    problems, _ = effective.check_log({**CONFIG, "max-num-seqs": 16, "shutdown-timeout": 45}, LOG)
    assert problems == ["max-num-seqs: the plan says 16, vLLM parsed 8",
                        "shutdown-timeout: the plan says 45, vLLM parsed 30"]


def test_engine_line_wins_over_what_was_parsed() -> None:
    problems, _ = effective.check_log({**CONFIG, "max-model-len": 384, "served-model-name": "other"}, LOG)
    assert problems == ["served-model-name: the plan says other, vLLM runs with tiny-llama",
                        "max-model-len: the plan says 384, vLLM runs with 512"]


def test_a_log_without_the_lines_is_a_failure_not_a_pass() -> None:
    problems, confirmed = effective.check_log(CONFIG, ["(APIServer pid=1) INFO starting"])
    assert problems and confirmed == 0


def test_norm_spells_values_one_way() -> None:
    assert effective.norm("torch.bfloat16") == "bfloat16"
    assert effective.norm(["tiny"]) == "tiny" == effective.norm("['tiny']")
    assert effective.norm(0.90) == effective.norm("0.9") == "0.9"
    assert effective.norm("'x'") == "x"
    assert effective.norm(True) == "True"


def test_expected_reads_no_keys_as_off() -> None:
    want = effective.expected({"no-enforce-eager": True, "port": 8000})
    assert want == {"enforce-eager": False, "port": 8000}


def test_non_default_args_with_objects_fall_back_to_text() -> None:
    line = "INFO non-default args: {'port': 8001, 'compilation_config': CompilationConfig(mode=3, x=[1, 2])}"
    args = effective.parse_non_default(line)
    assert args["port"] == "8001" and args["compilation_config"].startswith("CompilationConfig(")


def test_every_flag_the_lab_test_set_is_confirmed_by_its_real_start_up_log() -> None:
    """lab2's log after tests/hosts/test_deploy.py's changed-flags deploy (booleans off and on, integers,
    an extra_args integer and boolean off), against the config the planner renders for those flags."""
    from vllm_fleet.core.flags import ServeFlags, render_flags

    log = (FIX / "vllm-0.32.0-cpu-lab2-changed.log").read_text().splitlines()
    flags = ServeFlags(model="/var/lib/vllm/models/tiny-llama", served_model_name="tiny-llama",
                       dtype="bfloat16", max_model_len=384, max_num_seqs=4, max_num_batched_tokens=512,
                       block_size=32, enable_prefix_caching=False, enable_chunked_prefill=False,
                       enforce_eager=True, distributed_executor_backend="uni",
                       extra_args={"seed": 7, "enable-log-requests": False})
    config = render_flags(flags, "0.32.0", "cpu")
    assert config["no-enable-prefix-caching"] is True and config["no-enable-log-requests"] is True
    problems, confirmed = effective.check_log(config, log)
    assert problems == []
    # not in the log, all at vLLM's own defaults: trust-remote-code off, pipeline 1 (on the engine line
    # both), port 8000 and request logging off (neither among the non-default args)
    unconfirmed = set(effective.expected(config)) - {
        k.replace("_", "-") for k in effective.from_log(log)[0]} - {
        f for f, (_, key) in effective.ENGINE.items() if key}
    assert unconfirmed == {"port", "enable-log-requests"}
    assert confirmed == len(config) - 2


def test_the_deploys_own_remote_command_finds_both_lines(tmp_path: Path) -> None:
    """roles/smoke.py's command, run by a real sh (as pyinfra's sudo wrapper does: `sh -c
    '...'`), with
    systemctl and journalctl replaced by scripts that print lab1's captured journal: both lines must come
    back (a grep pattern in Python's regex dialect once matched only one of them)."""
    import shlex
    import subprocess

    from vllm_fleet.core.plan import InstancePlan
    from vllm_fleet.roles.smoke import effective_check, effective_command

    journal = tmp_path / "journal.txt"
    journal.write_text("(APIServer pid=1) INFO 12-03 12:31:00 [api_server.py:1] vLLM API server version\n"
                       + "\n".join(LOG) + "\n(APIServer pid=1) INFO Starting vLLM API server\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho 5f0c1b\n")
    (bin_dir / "journalctl").write_text(
        f"#!/bin/sh\ncase \"$*\" in *_SYSTEMD_INVOCATION_ID=5f0c1b*) cat {journal};; *) exit 1;; esac\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    inst = InstancePlan(name="default", unit="vllm-default.service", config_path="", env_path="",
                        served_name="tiny-llama", model_dir="", stage_from=None, flags=CONFIG,
                        environment={}, secret_env={}, tensor_parallel=1, dtype="bfloat16", gpu_indexes=(),
                        host="127.0.0.1", port=8000, shutdown_timeout=30)
    cmd = effective_command(inst).replace("/var/lib/vllm-fleet/staged", str(tmp_path))
    (tmp_path / "default.yaml.at-default").write_text('["port", "trust-remote-code"]')
    proc = subprocess.run(["sh", "-c", f"sh -c {shlex.quote(cmd)}"], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert sum(1 for line in proc.stdout.splitlines() if "non-default args: " in line) == 1
    assert sum(1 for line in proc.stdout.splitlines() if " with config: " in line) == 1

    import vllm_fleet.roles.smoke as smoke_role

    def fake_run(command: str) -> tuple[bool, str]:
        p = subprocess.run(["sh", "-c", command.replace("/var/lib/vllm-fleet/staged", str(tmp_path))],
                           capture_output=True, text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
        return p.returncode == 0, p.stdout

    original, smoke_role.run = smoke_role.run, fake_run
    try:
        check = effective_check(inst)
        assert check.ok and check.detail == f"{len(CONFIG) - 1} of {len(CONFIG)} in the log", check
        off = InstancePlan(**{**inst.__dict__, "flags": {**CONFIG, "no-enable-prefix-caching": True}})
        check = effective_check(off)
        assert not check.ok
        assert "enable-prefix-caching: the plan says False, vLLM runs with True" in check.detail
        # a setting the log lacks that the host check did not find at vLLM's default was not taken
        (tmp_path / "default.yaml.at-default").write_text('["trust-remote-code"]')
        check = effective_check(inst)
        assert not check.ok
        assert "port: the plan says 8000, vLLM's start-up log does not have it" in check.detail
    finally:
        smoke_role.run = original
