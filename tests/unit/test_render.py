"""Templates print the plan: unit, env file (the only place a secret value goes) and serve config YAML."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import jinja2
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_fleet.core import render
from vllm_fleet.core.gpus import Gpu
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.spec import parse_host

HOST = "gpu-07"
KEY = "sk-fleet-render-3b9d2e71"
HF = "hf_render_a1b2c3d4"
ENV = {"FLEET_KEY": KEY, "FLEET_HF": HF}
M = {"name": "qwen", "path": "/srv/models/qwen"}


def gpu(i: int) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-1111-{i}", name="NVIDIA H100 80GB HBM3", memory_mib=81559,
               compute_capability=(9, 0), pci_bus_id=f"00000000:{i + 0x18:02X}:00.0", minor=i)


def fake_variant(version: str, accelerator: str, driver: Any, gpus: list, override: str | None) -> Any:
    name = "cpu" if accelerator == "cpu" else "cu130"
    return SimpleNamespace(variant=name, reason="fake", release_dir=f"{version}-{name}",
                           build=SimpleNamespace(index_url=None, extra_index_urls=(), index_strategy=None,
                                                 accelerator="cuda" if name.startswith("cu") else "cpu"))


def make_plan(data: dict | None = None, n_gpus: int = 2, environ: dict | None = None) -> HostPlan:
    data = data or {"model": M, "api_key_env": "FLEET_KEY", "hf_token_env": "FLEET_HF"}
    spec = parse_host(HOST, data)
    facts = HostFacts(gpus=tuple(gpu(i) for i in range(n_gpus)), cpu_flags=frozenset({"avx512_bf16"}))
    return plan_host(HOST, spec, facts, ENV if environ is None else environ, choose_variant=fake_variant)


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def directive(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in lines_of(unit) if line.startswith(f"{key}=")]


# --- the unit -------------------------------------------------------------------------------------------
def test_unit_runs_vllm_serve_as_vllm_with_the_env_file() -> None:
    p = make_plan()
    inst = p.instances[0]
    u = render.unit(p, inst)
    assert directive(u, "User") == ["vllm"]
    assert directive(u, "Group") == ["vllm"]
    # non-secret settings first, the keys last (systemd: a later file wins)
    assert directive(u, "EnvironmentFile") == ["/etc/vllm/default.environment", "/etc/vllm/default.env"]
    assert directive(u, "ExecStart") == ["/opt/vllm/current/bin/vllm serve --config /etc/vllm/default.yaml"]
    assert directive(u, "TimeoutStartSec") == ["600"]
    assert directive(u, "WorkingDirectory") == ["/var/lib/vllm"]
    assert "[Unit]" in lines_of(u) and "[Service]" in lines_of(u) and "[Install]" in lines_of(u)
    assert u.endswith("\n")


@pytest.mark.parametrize("shutdown", [None, 0, 30, 120, 3600])
def test_timeout_stop_above_the_shutdown_timeout(shutdown: int | None) -> None:
    flags = {} if shutdown is None else {"shutdown_timeout": shutdown}
    p = make_plan({"model": M, "api_key_env": "FLEET_KEY", "flags": flags})
    u = render.unit(p, p.instances[0])
    (stop,) = directive(u, "TimeoutStopSec")
    assert int(stop) > (30 if shutdown is None else shutdown)


def test_unit_environment_lines_and_gpu_devices() -> None:
    p = make_plan()
    u = render.unit(p, p.instances[0])
    # the environment is in a 0600 file, never in the world-readable unit
    env = lines_of(render.environment_file(p.instances[0]))
    assert 'CUDA_VISIBLE_DEVICES="GPU-1111-0,GPU-1111-1"' in env
    assert 'HF_HUB_OFFLINE="1"' in env
    assert 'VLLM_HOST_IP="127.0.0.1"' in env
    assert not directive(u, "Environment")
    allow = directive(u, "DeviceAllow")
    assert "/dev/nvidia0 rw" in allow and "/dev/nvidia1 rw" in allow and "/dev/nvidiactl rw" in allow
    assert "/dev/nvidia2 rw" not in allow
    assert directive(u, "DevicePolicy") == ["closed"]
    assert "PrivateDevices=yes" not in lines_of(u)


def test_cpu_unit_has_no_gpu_devices() -> None:
    p = make_plan({"model": M, "accelerator": "cpu", "api_key_env": "FLEET_KEY"}, n_gpus=0)
    u = render.unit(p, p.instances[0])
    assert directive(u, "DeviceAllow") == []
    assert "PrivateDevices=yes" in lines_of(u)
    assert 'VLLM_CPU_KVCACHE_SPACE="1"' in lines_of(render.environment_file(p.instances[0]))
    assert not directive(u, "Environment")


def test_no_secret_value_in_unit_or_yaml() -> None:
    p = make_plan()
    for inst in p.instances:
        for text in (render.unit(p, inst), render.serve_config(p, inst)):
            assert KEY not in text
            assert HF not in text


def test_two_instances_get_their_own_paths() -> None:
    data = {"instances": [{"name": "chat", "model": M, "gpus": [0], "api_key_env": "FLEET_KEY"},
                          {"name": "embed", "model": M, "gpus": [1], "api_key_env": "FLEET_KEY",
                           "flags": {"port": 8001}}]}
    p = make_plan(data)
    chat, embed = (render.unit(p, i) for i in p.instances)
    assert directive(chat, "ExecStart") == ["/opt/vllm/current/bin/vllm serve --config /etc/vllm/chat.yaml"]
    assert directive(embed, "EnvironmentFile") == ["/etc/vllm/embed.environment", "/etc/vllm/embed.env"]
    assert "/dev/nvidia1 rw" in directive(embed, "DeviceAllow")
    assert "/dev/nvidia0 rw" not in directive(embed, "DeviceAllow")


@pytest.mark.parametrize("value", ['x"\nExecStartPre=/bin/true', "x\nExecStartPre=/bin/true", "50%"])
def test_env_values_cannot_inject_unit_directives(value: str) -> None:
    try:
        p = make_plan({"model": M, "api_key_env": "FLEET_KEY", "env": {"VLLM_NOTE": value}})
    except Exception:  # refusing such a value at parse time is a fine fix too
        return
    u = render.unit(p, p.instances[0])
    assert not any(line.startswith("ExecStartPre") for line in lines_of(u))
    assert not re.search(r"(?<!%)%(?!%)", "\n".join(line for line in lines_of(u) if "VLLM_NOTE" in line))


# --- the env file ---------------------------------------------------------------------------------------
def test_env_file_has_the_secrets_quoted() -> None:
    p = make_plan()
    text = render.env_file(p.instances[0], ENV)
    body = [line for line in lines_of(text) if not line.startswith("#")]
    assert body[-1:] == [f'VLLM_API_KEY="{KEY}"']  # secrets last
    assert HF not in text  # the HF token is only a hub fetch's (roles/hub.py), never vLLM's


def test_env_file_escapes_quotes_and_backslashes() -> None:
    p = make_plan({"model": M, "api_key_env": "FLEET_KEY"})
    text = render.env_file(p.instances[0], {"FLEET_KEY": 'a"b\\c $d'})
    assert 'VLLM_API_KEY="a\\"b\\\\c $d"' in lines_of(text)


def test_env_file_refuses_a_newline_in_a_secret() -> None:
    p = make_plan({"model": M, "api_key_env": "FLEET_KEY"})
    with pytest.raises(ValueError, match="line break"):
        render.env_file(p.instances[0], {"FLEET_KEY": "abc\nExecStart=/bin/sh"})


def test_the_environment_file_holds_the_environment_and_the_env_file_only_secrets() -> None:
    p = make_plan({"model": M, "api_key_env": None}, environ={})
    inst = p.instances[0]
    body = [line for line in lines_of(render.environment_file(inst)) if not line.startswith("#")]
    assert body == [f'{k}="{v}"' for k, v in sorted(inst.environment.items())]
    assert [line for line in lines_of(render.env_file(inst, {})) if not line.startswith("#")] == []


# --- the serve config -----------------------------------------------------------------------------------
def test_yaml_round_trips_to_exactly_the_flags() -> None:
    p = make_plan({"model": M, "api_key_env": "FLEET_KEY",
                   "flags": {"max_model_len": 32768, "enable_prefix_caching": False, "kv_cache_dtype": "fp8",
                             "extra_args": {"lora-modules": ["a=/x", "b=/y"], "seed": 0}}})
    inst = p.instances[0]
    text = render.serve_config(p, inst)
    loaded = yaml.safe_load(text)
    assert loaded == inst.flags
    assert list(loaded) == list(inst.flags)
    # spot-check the literal values that reach vLLM
    assert loaded["model"].startswith("/opt/vllm/models/qwen/")
    assert loaded["gpu-memory-utilization"] == 0.9
    assert loaded["block-size"] == 16
    assert loaded["no-enable-prefix-caching"] is True
    assert loaded["lora-modules"] == ["a=/x", "b=/y"]


@settings(max_examples=25, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,20}", fullmatch=True))
def test_yaml_keeps_any_allowed_served_name_a_string(name: str) -> None:
    # names such as 'on', 'null', '1e3', '0.5' or '12:30' must not turn into booleans, numbers or None
    p = make_plan({"model": M, "api_key_env": "FLEET_KEY", "flags": {"served_model_name": name}})
    loaded = yaml.safe_load(render.serve_config(p, p.instances[0]))
    assert loaded["served-model-name"] == name


def test_yaml_cpu_config_has_no_gpu_flags() -> None:
    p = make_plan({"model": M, "accelerator": "cpu", "api_key_env": "FLEET_KEY"}, n_gpus=0)
    loaded = yaml.safe_load(render.serve_config(p, p.instances[0]))
    assert loaded == p.instances[0].flags
    assert not {"gpu-memory-utilization", "tensor-parallel-size", "block-size"} & set(loaded)


# --- strictness -----------------------------------------------------------------------------------------
def test_unknown_variable_fails() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render.environment().from_string("x={{ no_such_thing }}").render()


def test_unknown_plan_attribute_fails() -> None:
    p = make_plan()
    with pytest.raises(jinja2.UndefinedError):
        render.environment().from_string("{{ i.no_such_field }}").render(i=p.instances[0])


def test_templates_need_every_variable_they_use() -> None:
    p = make_plan()
    inst = p.instances[0]
    with pytest.raises(jinja2.UndefinedError):
        render.environment().get_template("vllm.service.j2").render(i=inst)  # no current/state_dir/...
    with pytest.raises(jinja2.UndefinedError):
        render.environment().get_template("vllm-serve.yaml.j2").render(i=inst)  # no host
