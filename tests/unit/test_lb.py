"""The load balancer's model (vllm_fleet/core/lb.py) and its haproxy config, without hosts."""

from __future__ import annotations

import pytest

from vllm_fleet.core import lb, render
from vllm_fleet.core.spec import SpecError, parse_inventory

M = {"name": "tiny", "path": "/models/tiny"}
NET = {"model": M, "flags": {"host": "0.0.0.0"}}


def specs(**hosts):
    return parse_inventory((name, data, None) for name, data in hosts.items())


def test_one_server_per_instance_at_the_hosts_address():
    two = [{"name": "x", "flags": {"host": "0.0.0.0"}},
           {"name": "y", "flags": {"host": "10.0.0.9", "port": 8001}}]
    s = specs(a={**NET}, b={"model": M, "instances": two})
    b = lb.balancers({"lb": {"port": 9000}}, s, {"a": "10.0.0.1", "b": "10.0.0.2"})["lb"]
    assert [(x.name, x.address, x.port) for x in b.servers] == [
        ("a-default", "10.0.0.1", 8000), ("b-x", "10.0.0.2", 8000), ("b-y", "10.0.0.9", 8001)]
    assert b.served_name == "tiny" and b.api_key_env == "VLLM_API_KEY" and b.spec.port == 9000
    assert [x.name for x in b.servers_of("b")] == ["b-x", "b-y"]


def test_a_loopback_instance_cannot_be_balanced():
    with pytest.raises(SpecError) as e:
        lb.balancers({"lb": {}}, specs(a={"model": M}), {"a": "10.0.0.1"})
    assert e.value.problems == ["a: vllm.instances[default].flags.host: 127.0.0.1 is not reachable from the "
                                "load balancer lb; bind 0.0.0.0 or the host's address (a key is required)"]


@pytest.mark.parametrize(("data", "words"), [
    ({"hosts": ["nope"]}, "vllm_lb.hosts: not vLLM hosts of this inventory: nope"),
    ({"port": 0}, "vllm_lb.port"),
    ({"drain_timeout_s": "soon"}, "vllm_lb.drain_timeout_s: 'soon' (str) is not an integer"),
    ({"prot": 80}, "vllm_lb.prot: not a known key; did you mean port?"),
    ({"port": "8080"}, "vllm_lb.port: '8080' (str) is not an integer; write 8080"),
    ({"drain": "yes"}, "vllm_lb.drain: 'yes' (str) is not a boolean; write True"),
    ({"check_interval_s": True}, "vllm_lb.check_interval_s: True (bool) is not an integer"),
    ({"hosts": "a"}, "vllm_lb.hosts: 'a' (str) is not a list"),
    ("a", "vllm_lb: 'a' (str) is not a dict"),
])
def test_bad_lb_data_names_the_host_and_field(data, words):
    with pytest.raises(SpecError) as e:
        lb.balancers({"lb-01": data}, specs(a={**NET}), {})
    assert any(p.startswith("lb-01: ") and words in p for p in e.value.problems), e.value.problems


def test_lb_hosts_may_be_a_tuple():
    b = lb.balancers({"lb": {"hosts": ("a",)}}, specs(a={**NET}, b={**NET}), {})["lb"]
    assert b.spec.hosts == ["a"] and [x.host for x in b.servers] == ["a"]


def test_one_balancer_serves_one_model_with_one_key():
    two = specs(a={**NET}, b={"model": {"name": "other", "path": "/m"}, "flags": {"host": "0.0.0.0"}})
    with pytest.raises(SpecError, match="serve different models"):
        lb.balancers({"lb": {}}, two, {})
    keys = specs(a={**NET}, b={**NET, "api_key_env": "OTHER_KEY"})
    with pytest.raises(SpecError, match="different key variables"):
        lb.balancers({"lb": {}}, keys, {})


def test_haproxy_config_checks_a_completion_and_holds_no_key():
    b = lb.balancers({"lb": {"check_interval_s": 1}}, specs(a={**NET}), {"a": "10.0.0.1"})["lb"]
    cfg = render.haproxy_config(b, "/run/x.sock")
    assert "http-check send meth POST uri /v1/completions" in cfg
    assert 'hdr Authorization "Bearer ${VLLM_FLEET_LB_KEY}"' in cfg
    assert """body '{"model": "tiny", "prompt": "ping", "max_tokens": 1}'""" in cfg
    assert "server a-default 10.0.0.1:8000 check" in cfg and "inter 1s" in cfg
    assert "stats socket /run/x.sock mode 600 level admin" in cfg
