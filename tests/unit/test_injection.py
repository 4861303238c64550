"""The security review's input holes: flag injection through extra_args, control characters and host
names in rendered files, unsafe vLLM switches in env, env values in the world-readable unit, and a
digest of a secret file in the Manifest fact's output."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_render import make_plan

from vllm_fleet.core import render
from vllm_fleet.core.layout import KEYGUARD
from vllm_fleet.core.spec import UNSAFE_ENV, SpecError, parse_host, parse_inventory
from vllm_fleet.host.validate_serve import GUARD, KEY_EXPECTED, plan_refusals

M = {"name": "qwen", "path": "/srv/models/qwen"}


def refusal(data: dict, host: str = "lab2") -> str:
    with pytest.raises(SpecError) as e:
        parse_host(host, data)
    return str(e.value)


# --- item 3: extra_args lists, and the host-side comparison with the plan -------------------------------
def test_a_list_item_that_is_a_flag_is_refused() -> None:
    msg = refusal({"model": M, "flags": {"extra_args": {
        "tool-call-parser": ["hermes", "--host", "0.0.0.0", "--trust-remote-code"]}}})
    assert msg.startswith("lab2: vllm.instances[default].flags.extra_args.tool-call-parser: '--host'")


CONFIG = {"model": "/var/lib/vllm/models/qwen", "host": "127.0.0.1", "port": 8000,
          "no-trust-remote-code": True, "tensor-parallel-size": 2}
DEFAULTS = {"pipeline_parallel_size": 1, "data_parallel_size": 1, "headless": False, "nnodes": 1,
            "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29501, "trust_remote_code": False}


def parsed(**changes: object) -> argparse.Namespace:
    ns = {"model": CONFIG["model"], "model_tag": None, "host": "127.0.0.1", "port": 8000,
          "trust_remote_code": False, "tensor_parallel_size": 2, "api_key": None,
          "middleware": [GUARD], "grpc": False, **DEFAULTS}
    return argparse.Namespace(**{**ns, **changes})


def test_the_namespace_as_planned_passes() -> None:
    assert plan_refusals(CONFIG, parsed(), DEFAULTS.get, key_expected=True) == []


@pytest.mark.parametrize(("changes", "field"), [
    ({"host": "0.0.0.0"}, "host:"),
    ({"port": 9000}, "port:"),
    ({"trust_remote_code": True}, "trust-remote-code:"),
    ({"tensor_parallel_size": 1}, "tensor-parallel-size:"),
    # not in the file: must stay at the parser's default
    ({"pipeline_parallel_size": 2}, "pipeline-parallel-size:"),
    ({"data_parallel_size": 4}, "data-parallel-size:"),
    # a stray word after a one-value flag becomes vLLM's positional model
    ({"model_tag": "evil/model"}, "model:"),
])
def test_any_guarded_setting_off_the_plan_is_refused(changes: dict, field: str) -> None:
    out = plan_refusals(CONFIG, parsed(**changes), DEFAULTS.get, key_expected=True)
    assert len(out) == 1 and out[0].startswith(field), out


@pytest.mark.parametrize("key_expected", [True, False])
def test_an_api_key_on_the_namespace_is_refused_empty_or_not(key_expected: bool) -> None:
    for value in ([""], ["guessable"]):
        out = plan_refusals(CONFIG, parsed(api_key=value), DEFAULTS.get, key_expected)
        assert len(out) == 1 and out[0].startswith("api-key:") and "authentication off" in out[0]
        assert ("env file" in out[0]) == key_expected


@pytest.mark.parametrize("middleware", [None, [], [GUARD, "evil.Outer"], ["evil.Outer"]])
def test_a_keyed_instance_without_exactly_the_key_guard_is_refused(middleware: object) -> None:
    assert GUARD == KEYGUARD  # the host-side copy of the plan's module path
    out = plan_refusals(CONFIG, parsed(middleware=middleware), DEFAULTS.get, key_expected=True)
    assert len(out) == 1 and out[0].startswith("middleware:"), out


def test_the_grpc_frontend_is_refused_on_the_host_too() -> None:
    out = plan_refusals(CONFIG, parsed(grpc=True), DEFAULTS.get, key_expected=True)
    assert len(out) == 1 and out[0].startswith("grpc:"), out


def test_the_validator_is_told_whether_a_key_is_expected(monkeypatch) -> None:
    import vllm_fleet.roles.install as install

    sent: list[str] = []
    monkeypatch.setattr(install.python, "call", lambda name, function, command, label: sent.append(command))
    with_key = make_plan()
    without = make_plan({"model": M, "api_key_env": None})
    install.validate(with_key, with_key.instances[0], "/staged.yaml", "/staged.json", b"m\n", "/m")
    install.validate(without, without.instances[0], "/staged.yaml", "/staged.json", b"m\n", "/m")
    assert f"-- {KEY_EXPECTED} --model-on-disk --device" in sent[0]
    assert KEY_EXPECTED not in sent[1]
    # neither a key nor any environment value is in an argv: systemd reads the environment from a file
    assert "--environment /staged.json" in sent[0]
    assert "sk-" not in " ".join(sent) and "VLLM_HOST_IP" not in " ".join(sent)


# --- item 5: control characters and host names ---------------------------------------------------------
@pytest.mark.parametrize(("data", "path"), [
    ({"model": M, "env": {"OMP_WAIT_POLICY": "x\x00User=root\x00X-Pad="}}, "vllm.env.OMP_WAIT_POLICY"),
    ({"model": M, "env": {"A": "x\x0cy"}}, "vllm.env.A"),
    ({"model": M, "flags": {"extra_args": {"tool-call-parser": ["hermes", "x\nUser=root"]}}},
     "vllm.flags.extra_args.tool-call-parser[1]"),
    ({"instances": [{"name": "chat", "model": M, "flags": {"served_model_name": "q\u2028x"}}]},
     "vllm.instances[chat].flags.served_model_name"),
    ({"model": {"name": "qwen", "path": "/srv/q\rwen"}}, "vllm.model.path"),
    ({"model": M, "env": {"A\x00": "1"}}, "vllm.env.'A\\x00'"),
])
def test_every_string_with_a_control_character_is_refused_by_its_path(data: dict, path: str) -> None:
    msg = refusal(data)
    assert msg.startswith(f"lab2: {path}: contains the non-printable character"), msg
    assert "User=root" not in msg  # the value is never echoed


def test_control_characters_in_group_defaults_are_refused_too() -> None:
    with pytest.raises(SpecError, match=r"lab2: vllm_defaults.env.A: contains the non-printable"):
        parse_host("lab2", {"model": M}, {"env": {"A": "1\x00"}})


@pytest.mark.parametrize("name", ["lab2\nUser=root", "lab2 x", "lab2\x00", "", "-lab2", "lab/2"])
def test_an_inventory_host_name_that_is_not_hostname_like_is_refused(name: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_inventory([(name, {"model": M}, None)])
    assert "inventory host name" in str(e.value) and "\n" not in str(e.value).replace("\\n", "")


@pytest.mark.parametrize("name", ["lab2", "gpu-07.example.com", "node_3", "10.0.0.5", "user@gpu-1"])
def test_ordinary_host_names_pass(name: str) -> None:
    assert parse_inventory([(name, {"model": M}, None)])


def test_a_rendered_file_with_a_control_character_is_an_error() -> None:
    p = make_plan()
    bad = dataclasses.replace(p.instances[0], served_name="q\x00User=root")
    with pytest.raises(ValueError, match="vllm-default.service: rendered with the control character"):
        render.unit(p, bad)
    odd = dataclasses.replace(p.instances[0], environment={"A": "1\x00"})
    with pytest.raises(ValueError, match="control character"):
        render.environment_file(odd)
    with pytest.raises(ValueError, match="control character"):
        render.env_file(p.instances[0], {"FLEET_KEY": "k\x00User=root", "FLEET_HF": "h"})


# --- item 4 (config): switches that open admin routes or log responses ---------------------------------
@pytest.mark.parametrize("name", sorted(UNSAFE_ENV))
def test_unsafe_vllm_switches_are_refused_with_the_reason(name: str) -> None:
    msg = refusal({"model": M, "env": {name: "1"}})
    assert msg.startswith(f"lab2: vllm.instances[default].env.{name}: {UNSAFE_ENV[name]}")


def test_the_known_unsafe_switches_are_listed() -> None:
    assert {"VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
            "VLLM_DEBUG_LOG_API_SERVER_RESPONSE"} <= set(UNSAFE_ENV)


def test_loader_and_interpreter_variables_are_refused() -> None:
    """An inventory's LD_PRELOAD was deployed and the unit restarted with it: what the service loads is
    its release's code, nothing an inventory names."""
    assert {"LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONHOME", "PYTHONUSERBASE"} <= set(UNSAFE_ENV)
    assert "set by vllm-fleet itself" in refusal({"model": M, "env": {"PYTHONPATH": "/tmp"}})  # the guard's
    msg = refusal({"model": M, "env": {"LD_PRELOAD": "/tmp/x.so"}})
    assert "loads a library into every process of the service" in msg and "remove it from env" in msg
    msg = refusal({"model": M, "env": {"LD_BIND_NOW": "1"}})
    assert msg.startswith("lab2: vllm.instances[default].env.LD_BIND_NOW: a dynamic loader variable")


@pytest.mark.parametrize("name", ["DB_PASSWD", "HF_AUTH", "AWS_CREDENTIALS"])
def test_more_secret_looking_names_are_refused(name: str) -> None:
    assert "looks like a secret" in refusal({"model": M, "env": {name: "x"}})


# --- item 13: the environment lives in the 0600 env file, not the unit ---------------------------------
def test_the_unit_names_only_env_files_and_they_hold_every_value() -> None:
    p = make_plan({"model": M, "api_key_env": "FLEET_KEY", "env": {"HTTPS_PROXY": "http://u:pw@proxy:3128"}})
    inst = p.instances[0]
    unit = render.unit(p, inst)
    assert not [line for line in unit.splitlines() if line.startswith("Environment=")]
    assert "pw@proxy" not in unit and "CUDA_VISIBLE_DEVICES" not in unit
    env = render.environment_file(inst)
    for k, v in inst.environment.items():
        assert f'{k}="{v}"' in env.splitlines()
    assert render.env_file(inst, {"FLEET_KEY": "sk-1"}).rstrip().splitlines()[-1] == 'VLLM_API_KEY="sk-1"'
    files = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("EnvironmentFile=")]
    assert files == [inst.environment_path, inst.env_path]  # the keys' file last: it wins


def test_bench_units_get_the_env_file_and_no_values_on_the_command_line() -> None:
    from vllm_fleet.roles.bench import _env_props

    inst = make_plan().instances[0]
    assert _env_props(inst) == ["-p", f"EnvironmentFile={inst.environment_path}",
                                "-p", f"EnvironmentFile={inst.env_path}"]


# --- item 8: no digest of a secret file leaves the host ------------------------------------------------
def manifest_lines(sums: Path, *paths: Path) -> str:
    from vllm_fleet.roles.ops import _MANIFEST_PY

    return subprocess.run([sys.executable, "-c", _MANIFEST_PY, str(sums), *map(str, paths)],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def salted(tmp_path: Path, monkeypatch):
    import vllm_fleet.roles.ops as ops

    monkeypatch.setattr(ops, "SALT", tmp_path / "ctl" / "secret-salt")
    ops._salt.cache_clear()
    yield ops
    ops._salt.cache_clear()


def test_a_secret_file_is_reported_by_its_marker_never_by_a_digest(tmp_path: Path, salted) -> None:
    content = b'VLLM_API_KEY="sk-guess-me"\n'
    env, sums = tmp_path / "default.env", tmp_path / "sums.json"
    env.write_bytes(content)
    first = manifest_lines(sums, env)
    assert hashlib.sha256(content).hexdigest() not in first
    assert first.split()[0] == "unverified"  # no marker yet: never matches, so the file is written again
    # the upload's marker command, run as root on the host
    subprocess.run(["sh", "-c", salted.marker_command(str(env), content)], check=True)
    assert Path(salted.marker_path(str(env))).stat().st_mode & 0o777 == 0o600
    again = manifest_lines(sums, env)
    assert again.split()[0] == salted.secret_digest(content)
    assert manifest_lines(sums, env) == again  # a rerun with the same content is unchanged
    assert hashlib.sha256(content).hexdigest() not in again + (sums.read_text() if sums.exists() else "")
    assert os.stat(salted.SALT).st_mode & 0o777 == 0o600
    # changed on the host behind the controller's back: unverified again
    env.write_bytes(b'VLLM_API_KEY="sk-other"\n')
    assert manifest_lines(sums, env).split()[0] == "unverified"


def test_the_digest_depends_on_the_salt(tmp_path: Path, salted) -> None:
    d = salted.secret_digest(b"x")
    assert d.startswith("hmac-sha256:") and hashlib.sha256(b"x").hexdigest() not in d
    salted.SALT.write_text("00" * 32)
    salted._salt.cache_clear()
    assert salted.secret_digest(b"x") != d


def test_every_secret_file_is_a_secret_path() -> None:
    from vllm_fleet.roles import lb, ops

    inst = make_plan().instances[0]
    assert ops.is_secret_path(inst.env_path) and ops.is_secret_path(lb.ENV_FILE)
    assert not ops.is_secret_path(inst.config_path)


# --- from the attacker's review: root never reads a vllm-writable model; no frontend outside the guard --
@pytest.mark.parametrize("path", ["/var/lib/vllm/models/x", "/var/lib/vllm", "/var/lib/vllm/hf/../models/x"])
def test_a_host_path_the_vllm_user_can_write_is_refused(path: str) -> None:
    """Root reads a host_path model (the host fact, the validator's engine config, which imports a
    trust_remote_code model's code): under /var/lib/vllm the vllm user could plant links or code there."""
    msg = refusal({"model": {"name": "x", "host_path": path}})
    assert msg.startswith("lab2: vllm.instances[default].model: host_path")
    assert "the vllm user can write" in msg


def test_a_host_path_beside_the_vllm_home_is_fine() -> None:
    assert parse_host("lab2", {"model": {"name": "x", "host_path": "/var/lib/vllm-models/x"}})


@pytest.mark.parametrize("name", ["VLLM_USE_RUST_FRONTEND", "VLLM_RUST_FRONTEND_PATH"])
def test_a_frontend_that_never_loads_the_guard_is_refused(name: str) -> None:
    assert "key guard" in refusal({"model": M, "env": {name: "1"}})


@pytest.mark.parametrize("flag", ["grpc", "grpc-port", "grpc_port"])
def test_the_grpc_frontend_is_refused(flag: str) -> None:
    assert "checks no API key" in refusal({"model": M, "flags": {"extra_args": {flag: True}}})


def test_options_that_widen_what_a_key_holder_reaches_need_an_acknowledgement() -> None:
    """`allowed-local-media-path: /` was accepted without a word: every file the service can read, to any
    key holder of a multimodal model. Such options are refused until the instance names them in `widen`,
    and a whole system directory is refused even then."""
    msg = refusal({"model": M, "flags": {"extra_args": {"allowed-local-media-path": "/srv/media"}}})
    assert msg.startswith("lab2: vllm.instances[default].flags.extra_args.allowed-local-media-path: lets "
                          "every key holder have the server read files under that path")
    assert "acknowledge it in this instance's widen: [allowed-local-media-path]" in msg
    ok = parse_host("lab2", {"model": M, "widen": ["allowed-local-media-path"],
                             "flags": {"extra_args": {"allowed-local-media-path": "/srv/media"}}})
    assert ok.instances[0].flags.extra_args["allowed-local-media-path"] == "/srv/media"
    msg = refusal({"model": M, "widen": ["allowed-local-media-path"],
                   "flags": {"extra_args": {"allowed-local-media-path": "/"}}})
    assert "would serve a whole system directory to every key holder" in msg
    assert "is not an option that needs acknowledging" in refusal({"model": M, "widen": ["max-num-seqs"]})
    assert "writes every request's prompt into the journal" in refusal(
        {"model": M, "flags": {"extra_args": {"enable-log-requests": True}}})
    off = parse_host("lab2", {"model": M, "flags": {"extra_args": {"enable-log-requests": False}}})
    assert off.instances[0].flags.extra_args == {"enable-log-requests": False}  # off needs no acknowledging


def test_security_doc_lists_every_option_that_needs_an_acknowledgement() -> None:
    from pathlib import Path

    from vllm_fleet.core.flags import WIDENING_FLAGS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert [f for f in WIDENING_FLAGS if f"`{f}`" not in doc] == []
