"""fleet/effective.py against a real start-up log: captured from lab1's journal (vLLM 0.32.0, CPU build,
the tiny model) together with the config file it was started from (tests/fixtures/startup_logs/)."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleet import effective

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
