"""Off is off on every release: the host check reads each key as the release's own parser does.

vLLM 0.33 paired `--enable-x` with `--disable-x` and hid `--no-enable-x` from the action's
option_strings while still accepting it (its EnableDisableAction, captured from the 0.33.0 wheel in
tests/fixtures/vllm_argparse). A check that built its known flags from option_strings refused
`enable_prefix_caching: False` there, and read the inverse alias `disable-prefix-caching: true` as a
setting of its own that vLLM "made False". 0.32 and older use argparse's own BooleanOptionalAction.
The lab runs the same check with the releases themselves (tests/hosts/test_cuda_stage_lab.py, 0.33.0;
tests/hosts/test_deploy.py, 0.32.0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from vllm_fleet.core import flags, variants
from vllm_fleet.core.startup import startup_refusals
from vllm_fleet.host import effective
from vllm_fleet.host.validate_serve import _at_default, _parsed, meanings, options_of

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm_argparse"
sys.path.insert(0, str(FIXTURES))
sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
import argparse_0_33_0 as v033  # noqa: E402
import release_parser  # noqa: E402


def serve_parser(release: str) -> argparse.ArgumentParser:
    """The options these tests need, declared as vLLM declares them (EngineArgs: booleans with
    BooleanOptionalAction, which 0.33's parser swaps for its EnableDisableAction)."""
    p = v033.Parser() if release == "0.33" else argparse.ArgumentParser()
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--max-num-seqs", type=int, default=None)
    return p


def test_the_hidden_negation_is_an_option_of_0_33_and_missing_from_its_actions_lists() -> None:
    p = serve_parser("0.33")
    listed = {s for a in p._actions for s in a.option_strings}
    assert "--no-enable-prefix-caching" not in listed  # what the check used to know: off was refused
    assert {"--no-enable-prefix-caching", "--disable-prefix-caching",
            "--enable-prefix-caching"} <= set(options_of(p))


@pytest.mark.parametrize("release", ["0.32", "0.33"])
@pytest.mark.parametrize(("config", "want"), [
    ({"no-enable-prefix-caching": True}, {"enable-prefix-caching": False}),
    ({"enable-prefix-caching": True}, {"enable-prefix-caching": True}),
    ({"no-enforce-eager": True, "max-num-seqs": 8}, {"enforce-eager": False, "max-num-seqs": 8}),
    ({"disable-log-stats": True}, {"disable-log-stats": True}),
])
def test_every_spelling_means_what_the_releases_parser_makes_of_it(release, config, want) -> None:
    p = serve_parser(release)
    meant = meanings(config, options_of(p), p)
    assert {s: v for s, v in meant.values()} == want
    ns = p.parse_args([f"--{k}" if v is True else f"--{k}={v}" for k, v in config.items()])
    assert effective.differences(want, _parsed(want, ns), "vLLM's parser made it") == []


def test_inverse_aliases_of_0_33_are_the_same_setting_turned_the_other_way() -> None:
    p = serve_parser("0.33")
    meant = meanings({"disable-prefix-caching": True, "disable-chunked-prefill": True,
                      "max-num-seqs": 4}, options_of(p), p)
    assert meant == {"disable-prefix-caching": ("enable-prefix-caching", False),
                     "disable-chunked-prefill": ("enable-chunked-prefill", False),
                     "max-num-seqs": ("max-num-seqs", 4)}
    ns = p.parse_args(["--disable-prefix-caching", "--disable-chunked-prefill", "--max-num-seqs=4"])
    want = dict(meant.values())
    assert effective.differences(want, _parsed(want, ns), "vLLM's parser made it") == []
    # the parser's default for prefix caching is None (vLLM decides), so False is not at its default
    assert _at_default(want, p, ns) == []


def test_0_32_has_no_inverse_alias_so_the_check_refuses_it_as_unknown() -> None:
    assert "--disable-prefix-caching" not in options_of(serve_parser("0.32"))


def test_after_the_restart_the_log_is_read_by_setting_not_by_spelling() -> None:
    """The non-default args line names dests (enable_prefix_caching=False); the host check's settings
    map says `disable-prefix-caching` is that setting. Without the map the key is not in the log."""
    config = {"disable-prefix-caching": True, "max-num-seqs": 4}
    line = ("(APIServer pid=1) INFO [api_utils.py:286] non-default args: {'max_num_seqs': 4, "
            "'enable_prefix_caching': False}")
    engine = "(EngineCore pid=2) INFO Initializing a V1 LLM engine (v0.33.0) with config: model='/m', seed=0"
    settings = {"disable-prefix-caching": ["enable-prefix-caching", False]}
    problems, confirmed = effective.check_log(config, [line, engine], at_default=[], settings=settings)
    assert problems == [] and confirmed == 2
    problems, _ = effective.check_log(config, [line, engine], at_default=[])
    assert problems == ["disable-prefix-caching: the plan says True, vLLM's start-up log does not have it"]
    # and a log that shows the setting on is a difference, named by the setting
    on = line.replace("'enable_prefix_caching': False", "'enable_prefix_caching': True")
    problems, _ = effective.check_log(config, [on, engine], at_default=[], settings=settings)
    assert problems == ["enable-prefix-caching: the plan says False, vLLM parsed True"]


# --- rendering: the off form each release's help spells (vllm_fleet/data/parser.toml) ---------------------
TABLE_RELEASES = sorted(variants.load_table())


def test_every_release_of_the_table_has_parser_facts() -> None:
    missing = [r for r in TABLE_RELEASES if r not in flags.parser_facts()]
    assert not missing, f"run scripts/release_parser.py --pypi {' '.join(missing)} ... --write"


def test_the_facts_script_reads_the_captured_0_33_parser_module_and_a_module_without_pairs() -> None:
    """scripts/release_parser.py reads the parser module with ast: here the class captured from 0.33.0
    (with its registration) and argparse's own action alone (0.32 and older)."""
    facts = release_parser.negation((FIXTURES / "argparse_0_33_0.py").read_text())
    assert facts == {"inverse_prefixes": {"--enable-": "--disable-", "--disable-": "--enable-"},
                     "no_form_hidden": True}
    plain = "from argparse import BooleanOptionalAction\nclass FlexibleArgumentParser: pass\n"
    assert release_parser.negation(plain) == {"inverse_prefixes": {}, "no_form_hidden": False}


@pytest.mark.parametrize(("release", "off"), [
    ("0.31.0", {"no-enable-prefix-caching": True, "no-enable-chunked-prefill": True}),
    ("0.32.0", {"no-enable-prefix-caching": True, "no-enable-chunked-prefill": True}),
    ("0.33.0", {"disable-prefix-caching": True, "disable-chunked-prefill": True}),
    ("0.34.0", {"disable-prefix-caching": True, "disable-chunked-prefill": True}),
])
def test_off_is_rendered_as_the_releases_parser_spells_it_and_read_back_as_the_field(release, off) -> None:
    f = flags.ServeFlags(enable_prefix_caching=False, enable_chunked_prefill=False, enforce_eager=False,
                         extra_args={"enable-log-outputs": False})
    out = flags.render_flags(f, release, "cuda")
    assert {k: v for k, v in out.items() if "prefix" in k or "chunked" in k} == off
    assert out["no-enforce-eager"] is True  # not an enable-/disable- flag: `--no-` on every release
    paired = release >= "0.33.0"
    # an extra_args key keeps `no-<key>` on every release: its inverse alias is another option's name
    assert out.get("no-enable-log-outputs") is True and "disable-log-outputs" not in out
    back = dict(flags.field_of(k, v) for k, v in out.items())
    assert back["enable_prefix_caching"] is False and back["enable_chunked_prefill"] is False
    # and the release's own parser (0.33's action, or argparse's) reads each off key as the field off
    p = serve_parser("0.33" if paired else "0.32")
    meant = meanings({k: v for k, v in off.items()}, options_of(p), p)
    assert dict(meant.values()) == {"enable-prefix-caching": False, "enable-chunked-prefill": False}


def test_a_release_without_facts_turns_off_with_the_no_form() -> None:
    assert flags.off_key("enable-prefix-caching", "9.9.9") == "no-enable-prefix-caching"
    assert flags.off_key("disable-log-stats", "0.33.0") == "enable-log-stats"
    assert flags.field_of("enable-log-stats", True) == ("enable_log_stats", True)  # not a typed field


def test_help_in_a_config_is_never_run_by_the_check() -> None:
    p = serve_parser("0.33")
    assert meanings({"help": True}, options_of(p), p) == {"help": ("help", True)}


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0"])
def test_the_plans_checks_read_rendered_flags_as_settings_on_every_release(release) -> None:
    """core/startup.py reads the rendered flags through flags.settings_of: off is False whichever way the
    release spells it, and an extra_args `no-` form is its setting off too."""
    f = flags.ServeFlags(enable_prefix_caching=False, enable_chunked_prefill=False, max_num_seqs=4,
                         extra_args={"no-enable-mfu-metrics": True})
    got = flags.settings_of(flags.render_flags(f, release, "cpu"))
    assert got["enable-prefix-caching"] is False and got["enable-chunked-prefill"] is False
    assert got["enforce-eager"] is False and got["trust-remote-code"] is False
    assert got["enable-mfu-metrics"] is False and got["max-num-seqs"] == 4


def test_an_extra_args_key_turned_off_is_never_rendered_as_another_options_name() -> None:
    """`disable-log-requests: false` means prompt logging on; rendered as 0.33's inverse alias it would be
    `enable-log-requests: true`, which the inventory asks a widen acknowledgement for. It stays
    `no-disable-log-requests`, an option 0.33 does not have, so the plan refuses it."""
    out = flags.render_flags(flags.ServeFlags(extra_args={"disable-log-requests": False}), "0.33.0", "cuda")
    assert "enable-log-requests" not in out and out.get("no-disable-log-requests") is True
    refused = startup_refusals("gpu-1", "default", out, vllm_version="0.33.0", accelerator="cuda")
    assert any("vLLM 0.33.0 has no --no-disable-log-requests" in line for line in refused), refused


def test_the_inverse_alias_of_a_typed_flag_in_extra_args_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="is enable-prefix-caching the other way round, which has a typed"):
        flags.ServeFlags(extra_args={"disable-prefix-caching": True})


def test_an_option_that_exits_while_read_is_a_refusal_not_an_acceptance() -> None:
    class Exits(argparse.Action):
        def __init__(self, option_strings, dest, **kw):
            super().__init__(option_strings, dest, nargs=0, **kw)

        def __call__(self, parser, namespace, values, option_string=None):
            parser.exit(0)

    p = serve_parser("0.32")
    p.add_argument("--show-and-exit", action=Exits)
    with pytest.raises(ValueError, match="--show-and-exit: vLLM's option could not be read"):
        meanings({"show-and-exit": True}, options_of(p), p)
