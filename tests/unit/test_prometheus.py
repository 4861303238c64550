"""vllm_fleet/core/prometheus.py: plans -> Prometheus file_sd groups, and the atomic write of
roles/targets.py.
The lab test tests/hosts/test_prometheus.py has a real Prometheus scrape the generated file."""

from __future__ import annotations

import dataclasses
import json
import stat
from typing import Any

from vllm_fleet.core.cluster import NodeRole
from vllm_fleet.core.plan import HostFacts, HostPlan, plan_host
from vllm_fleet.core.prometheus import file_sd, render, scrape_address, summary
from vllm_fleet.core.spec import parse_host

ENV = {"VLLM_API_KEY": "sk-prom-test"}


def cpu_plan(host: str, *instances: dict[str, Any]) -> HostPlan:
    data = {"accelerator": "cpu", "model": {"name": "tiny-llama", "host_path": "/opt/models/tiny"},
            "open_paths": ["/health", "/metrics"],
            "instances": list(instances) or [{"name": "default", "flags": {"host": "0.0.0.0"}}]}
    return plan_host(host, parse_host(host, data), HostFacts(), ENV)


def test_wildcard_bind_is_scraped_at_the_ssh_address_with_the_plans_labels() -> None:
    groups, left_out = file_sd([(cpu_plan("gpu-07"), "10.0.0.7")])
    assert groups == [{"targets": ["10.0.0.7:8000"],
                       "labels": {"host": "gpu-07", "instance": "default", "model": "tiny-llama",
                                  "release": "0.32.0-cpu"}}]
    assert left_out == []


def test_a_specific_bind_address_is_scraped_there_and_loopback_is_left_out_with_why() -> None:
    p = cpu_plan("gpu-07", {"name": "lan", "flags": {"host": "192.168.5.7", "port": 8001}},
                 {"name": "local", "flags": {"host": "127.0.0.1", "port": 8002}},
                 {"name": "named", "flags": {"host": "localhost", "port": 8003}})
    groups, left_out = file_sd([(p, "gpu-07.example.net")])
    assert [g["targets"] for g in groups] == [["192.168.5.7:8001"]]
    assert [(x.instance, x.why) for x in left_out] == [("local", "binds 127.0.0.1"),
                                                        ("named", "binds localhost")]


def test_ipv6_addresses_are_bracketed() -> None:
    inst = cpu_plan("h", {"name": "v6", "flags": {"host": "::"}}).instances[0]
    assert scrape_address(inst, "fd00::7") == "[fd00::7]:8000"
    assert scrape_address(dataclasses.replace(inst, host="fd00::9"), "h") == "[fd00::9]:8000"
    assert scrape_address(inst, "gpu-07") == "gpu-07:8000"


def test_served_model_name_and_tls_come_from_the_plan() -> None:
    p = cpu_plan("h", {"name": "default", "flags": {"host": "0.0.0.0", "served_model_name": "chat",
                                                     "extra_args": {"ssl-certfile": "/etc/ssl/v.pem",
                                                                    "ssl-keyfile": "/etc/ssl/v.key"}}})
    (group,), _ = file_sd([(p, "h")])
    assert group["labels"]["model"] == "chat"
    assert group["labels"]["__scheme__"] == "https"


def test_a_node_groups_headless_workers_have_no_target() -> None:
    def node(rank: int) -> NodeRole:
        return NodeRole("pair", rank, ("a", "b"), ("10.1.0.1", "10.1.0.2"), "tensor", 29501)

    head, worker = cpu_plan("a"), cpu_plan("b")
    head = dataclasses.replace(head, instances=(dataclasses.replace(head.instances[0], node=node(0)),))
    worker = dataclasses.replace(worker, instances=(dataclasses.replace(worker.instances[0], node=node(1)),))
    groups, left_out = file_sd([(worker, "10.1.0.2"), (head, "10.1.0.1")])
    assert [g["labels"]["host"] for g in groups] == ["a"]
    assert [(x.host, x.why) for x in left_out] == [("b", "headless worker of cluster pair (no API)")]


def test_the_file_is_stable_valid_file_sd_and_the_summary_is_one_line() -> None:
    plans = [(cpu_plan("web-2"), "10.0.0.2"),
             (cpu_plan("web-1", {"name": "b", "flags": {"host": "0.0.0.0", "port": 8001}},
                       {"name": "a", "flags": {"host": "0.0.0.0"}},
                       {"name": "c", "flags": {"host": "127.0.0.1", "port": 8002}}), "10.0.0.1")]
    groups, left_out = file_sd(plans)
    text = render(groups)
    assert text == render(file_sd(list(reversed(plans)))[0])  # input order does not change the bytes
    loaded = json.loads(text)
    assert [(g["labels"]["host"], g["labels"]["instance"]) for g in loaded] == [
        ("web-1", "a"), ("web-1", "b"), ("web-2", "default")]
    for g in loaded:  # file_sd: a list of {"targets": [str], "labels": {str: str}}
        assert set(g) == {"targets", "labels"}
        assert all(isinstance(t, str) for t in g["targets"])
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in g["labels"].items())
    line = summary(groups, left_out, "/etc/prometheus/file_sd/vllm.json")
    assert line == ("targets: 3 target(s) on 2 host(s) written to /etc/prometheus/file_sd/vllm.json; "
                    "left out: web-1/c (binds 127.0.0.1)")
    assert "\n" not in line


def test_write_atomically_replaces_the_file_readable_by_prometheus_and_leaves_no_temp(tmp_path) -> None:
    from vllm_fleet.roles.targets import write_atomically

    out = tmp_path / "vllm.json"
    out.write_text("old")
    write_atomically(out, "[]\n")
    assert out.read_text() == "[]\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["vllm.json"]


def test_an_instance_with_a_key_whose_metrics_are_not_open_is_left_out_with_why() -> None:
    data = {"accelerator": "cpu", "model": {"name": "tiny-llama", "host_path": "/opt/models/tiny"},
            "instances": [{"name": "shut", "flags": {"host": "0.0.0.0"}},
                          {"name": "open", "flags": {"host": "0.0.0.0", "port": 8001},
                           "open_paths": ["/health", "/metrics"]}]}
    p = plan_host("h", parse_host("h", data), HostFacts(), ENV)
    groups, left_out = file_sd([(p, "h")])
    assert [g["labels"]["instance"] for g in groups] == ["open"]
    assert [(x.instance, x.why) for x in left_out] == [
        ("shut", '/metrics needs the API key; add "/metrics" to open_paths')]


def test_a_door_is_scraped_at_both_endpoints_unless_it_keeps_them_on_loopback() -> None:
    from vllm_fleet.core import lb
    from vllm_fleet.core.prometheus import LeftOut, door_targets
    from vllm_fleet.core.spec import parse_inventory

    data = {"model": {"name": "tiny", "path": "/m"}, "flags": {"host": "0.0.0.0"}}
    specs = parse_inventory([("a", data, None)])
    tenants = [{"name": "t", "key_envs": ["K"]}]
    open_door = lb.balancers({"d1": {"metrics": {"bind": "0.0.0.0"}, "tenants": tenants}}, specs, {})["d1"]
    closed = lb.balancers({"d2": {}}, specs, {})["d2"]
    groups, left_out = door_targets([(closed, "10.0.0.2"), (open_door, "10.0.0.1")])
    assert groups == [
        {"targets": ["10.0.0.1:8405"], "labels": {"host": "d1", "instance": "door", "endpoint": "haproxy",
                                                  "__metrics_path__": "/metrics"}},
        {"targets": ["10.0.0.1:8405"], "labels": {"host": "d1", "instance": "door", "endpoint": "tenants",
                                                  "__metrics_path__": "/metrics/tenants"}}]
    assert left_out == [LeftOut("d2", "door", "its metrics bind 127.0.0.1")]
