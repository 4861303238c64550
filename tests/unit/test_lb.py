"""The front door's model (vllm_fleet/core/lb.py), its haproxy config and router units, without hosts."""

from __future__ import annotations

import json

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
    assert [m.name for m in b.models] == ["tiny"] and b.key_vars == (("VLLM_API_KEY", "VLLM_FLEET_LB_KEY_0"),)
    assert b.spec.port == 9000 and {x.key_var for x in b.servers} == {"VLLM_FLEET_LB_KEY_0"}
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
    ({"prot": 80}, "vllm_lb.prot: not a known key; did you mean port"),
    ({"tenants": [{"name": "A B", "key_envs": ["K"]}]}, "vllm_lb.tenants[0].name"),
    ({"tenants": [{"name": "a", "key_envs": []}]}, "vllm_lb.tenants[0].key_envs"),
    ({"tenants": [{"name": "a", "keys": ["K"]}]}, "vllm_lb.tenants[0].keys: not a known key"),
    ({"tenants": [{"name": "a", "key_envs": ["K"], "models": ["gpt"]}]},
     "vllm_lb.tenants[a].models: gpt is served by no instance behind this door (it serves tiny)"),
    ({"tenants": [{"name": "a", "key_envs": ["K"]}, {"name": "a", "key_envs": ["J"]}]},
     "vllm_lb.tenants: a is named twice"),
    ({"tenants": [{"name": "a", "key_envs": ["K"]}, {"name": "b", "key_envs": ["K"]}]},
     "the key variable K is given twice"),
    ({"router": {"policy": "fastest"}}, "vllm_lb.router.policy"),
    ({"router": {"index_url": "https://u:p@mirror/simple"}}, "vllm_lb.router.index_url"),
    ({"port": 30005}, "vllm_lb.port: 30005 is inside the door's own loopback ports 30000-32999"),
    ({"extra_routes": ["/metrics"]}, "vllm_lb.extra_routes: /metrics is an administration route"),
    ({"extra_routes": ["/v1/x y"]}, "is not a plain path"),
    ({"port": "8080"}, "vllm_lb.port: '8080' (str) is not an integer; write 8080"),
    ({"drain": "yes"}, "vllm_lb.drain: 'yes' (str) is not a boolean; write True"),
    ({"check_interval_s": True}, "vllm_lb.check_interval_s: True (bool) is not an integer"),
    ({"hosts": "a"}, "vllm_lb.hosts: 'a' (str) is not a list"),
    ({"tenants": [{"name": "a", "key_envs": ["K"], "tokens_per_min": 0}]},
     "vllm_lb.tenants[0].tokens_per_min"),
    ({"metrics": {"port": 31000}}, "vllm_lb.metrics.port: 31000 is inside the door's own loopback ports"),
    ({"metrics": {"port": 8080}}, "vllm_lb.metrics.port: 8080 is the door's own port"),
    ({"metrics": {"bind": "any"}}, "vllm_lb.metrics.bind"),
    ("a", "vllm_lb: 'a' (str) is not a dict"),
])
def test_bad_lb_data_names_the_host_and_field(data, words):
    with pytest.raises(SpecError) as e:
        lb.balancers({"lb-01": data}, specs(a={**NET}), {})
    assert any(p.startswith("lb-01: ") and words in p for p in e.value.problems), e.value.problems


def test_lb_hosts_may_be_a_tuple():
    b = lb.balancers({"lb": {"hosts": ("a",)}}, specs(a={**NET}, b={**NET}), {})["lb"]
    assert b.spec.hosts == ["a"] and [x.host for x in b.servers] == ["a"]


TWO = {"a": {**NET}, "b": {**NET},
       "c": {"model": M, "flags": {"host": "0.0.0.0", "served_model_name": "tiny-b"}, "api_key_env": "C_KEY"}}
ADDR = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
TENANTS = [{"name": "team-a", "key_envs": ["KA", "KA_NEXT"]},
           {"name": "team-b", "key_envs": ["KB"], "models": ["tiny-b"], "requests_per_min": 5}]


def door(**data):
    return lb.balancers({"door": data}, specs(**TWO), ADDR)["door"]


def test_one_door_serves_every_model_each_with_its_instances_and_key():
    b = door()
    assert [(m.name, [s.name for s in m.servers]) for m in b.models] == [
        ("tiny", ["a-default", "b-default"]), ("tiny-b", ["c-default"])]
    assert dict(b.key_vars) == {"C_KEY": "VLLM_FLEET_LB_KEY_0", "VLLM_API_KEY": "VLLM_FLEET_LB_KEY_1"}
    assert [s.key_var[-1] for s in b.servers if s.key_var] == ["1", "1", "0"]
    assert [b.listener_port(s) for s in b.servers] == [31000, 31001, 31002]
    assert [b.router_port(m) for m in b.models] == [30000, 30001]


def test_model_slugs_keep_look_alike_names_apart():
    assert lb.model_slug("org/Model-7B") != lb.model_slug("org-Model-7B")
    assert lb.model_slug("org/Model-7B").startswith("org-model-7b-")


def test_each_listener_checks_a_completion_and_falls_back_on_its_models_other_instances():
    cfg = render.haproxy_config(door(check_interval_s=1), "/run/x.sock", "/etc/haproxy/vllm-fleet")
    a = cfg.split("listen a-default", 1)[1].split("\nlisten ", 1)[0]
    assert """body '{"model": "tiny", "prompt": "ping", "max_tokens": 1}'""" in a
    assert 'hdr Authorization "Bearer ${VLLM_FLEET_LB_KEY_1}"' in a and "inter 1s" in a
    assert "server a-default 10.0.0.1:8000 check" in a
    assert "server b-default 10.0.0.2:8000 backup track b-default/b-default" in a
    assert "c-default" not in a  # another model's instance is never a backup
    c = cfg.split("listen c-default", 1)[1]
    assert "backup" not in c and '"model": "tiny-b"' in c
    assert "stats socket /run/x.sock mode 600 level admin" in cfg
    # without tenants the client's own key goes through to vLLM: the listener sets none
    assert "http-request set-header Authorization" not in cfg and "http_auth_bearer" not in cfg


def test_tenants_are_checked_at_the_edge_and_their_keys_end_there():
    cfg = render.haproxy_config(door(tenants=TENANTS), "/run/x.sock", "/m")
    edge = cfg.split("frontend door", 1)[1].split("\nbackend ", 1)[0]
    order = ["acl api_route", "return status 404", "http_auth_bearer,sha2(256)", "status 401", "track-sc0",
             "status 429", "del-header authorization", "models.json", "status 413", "json_query('$.model')",
             "unknown-model.json", "status 403", "use_backend"]
    assert [edge.index(w) for w in order] == sorted(edge.index(w) for w in order), edge
    assert 'set-header Authorization "Bearer ${VLLM_FLEET_LB_KEY_0}"' in cfg.split("listen c-default", 1)[1]
    for route in lb.API_ROUTES:
        assert f" {route}" in edge.split("acl api_route path", 1)[1].split("\n", 1)[0]
    for admin in ("/metrics", "/pause", "/sleep", "/collective_rpc", "/server_info", "/invocations"):
        assert f" {admin}" not in edge.split("acl api_route path", 1)[1].split("\n", 1)[0]


def test_tenant_maps_hold_hashes_pairs_and_limits_never_a_key():
    env = {"KA": "secret-a", "KA_NEXT": "secret-a2", "KB": "secret-b"}
    files = lb.door_files(door(tenants=TENANTS), env)
    assert not [f for f, text in files.items() if any(v in text for v in env.values())]
    assert files["keys.map"].split("\n")[:3] == [f"{lb.key_hash('secret-a')} team-a",
                                                  f"{lb.key_hash('secret-a2')} team-a",
                                                  f"{lb.key_hash('secret-b')} team-b"]
    assert files["allowed.map"] == "team-a/tiny 1\nteam-a/tiny-b 1\nteam-b/tiny-b 1\n"
    assert files["limits.map"] == "team-b 5\n"
    assert {m["id"] for m in json.loads(files["models.json"])["data"]} == {"tiny", "tiny-b"}
    assert "tiny, tiny-b" in files["unknown-model.json"]
    assert files["backends.map"] == (f"tiny model-{lb.model_slug('tiny')}\n"
                                     f"tiny-b model-{lb.model_slug('tiny-b')}\n")


def test_a_tenant_left_without_any_key_is_refused_a_rotation_is_not():
    b = door(tenants=TENANTS)
    assert lb.missing_tenant_keys(b, {"KA_NEXT": "x", "KB": "y"}) == []
    assert lb.missing_tenant_keys(b, {"KA": "", "KB": "y"}) == [
        "door: vllm_lb.tenants[team-a].key_envs: none of KA, KA_NEXT is set (or all are empty) in the "
        "controller's environment"]


def test_each_model_gets_a_router_on_loopback_pointing_at_its_listeners():
    b = door(router={"policy": "round_robin", "version": "0.1.17"})
    argv = lb.router_argv(b, b.models[0])
    assert argv[0] == "/opt/vllm-fleet/router/0.1.17/bin/vllm-router"
    assert argv[argv.index("--worker-urls") + 1:argv.index("--worker-urls") + 3] == [
        "http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert argv[argv.index("--policy") + 1] == "round_robin" and argv[argv.index("--host") + 1] == "127.0.0.1"
    unit = render.router_unit(b, b.models[1])
    assert "DynamicUser=yes" in unit and "http://127.0.0.1:31002" in unit and "31000" not in unit
    assert lb.router_unit(b.models[1]) == f"vllm-fleet-router-{lb.model_slug('tiny-b')}.service"
    cfg = render.haproxy_config(b, "/s", "/m")
    assert "server router 127.0.0.1:30001 check" in cfg
    # vllm-router's /health is 503 while any one instance is unhealthy: the router's check is a connection
    backend = cfg.split(f"backend model-{lb.model_slug('tiny-b')}", 1)[1].split("\n\n", 1)[0]
    assert "httpchk" not in backend, backend


def test_without_a_router_haproxy_balances_a_models_listeners_itself():
    cfg = render.haproxy_config(door(router=None), "/s", "/m")
    tiny = cfg.split(f"backend model-{lb.model_slug('tiny')}", 1)[1].split("\n\n", 1)[0]
    assert "balance leastconn" in tiny and "127.0.0.1:31000" in tiny and "127.0.0.1:31001" in tiny


# what door.lua served on /metrics/tenants under haproxy 2.6.12 (Debian 12), two tenants after a few
# requests: the text tenant_usage reads
SERVED = """\
# HELP vllm_fleet_door_requests_total Requests with a tenant's key, by the answer's status.
# TYPE vllm_fleet_door_requests_total counter
vllm_fleet_door_requests_total{tenant="team-a",code="200"} 2
vllm_fleet_door_requests_total{tenant="team-a",code="429"} 2
vllm_fleet_door_requests_total{tenant="team-b",code="200"} 1
vllm_fleet_door_tokens_total{tenant="team-a",kind="completion"} 40
vllm_fleet_door_tokens_total{tenant="team-a",kind="prompt"} 20
vllm_fleet_door_tokens_total{tenant="team-a",kind="streamed"} 0
vllm_fleet_door_tokens_total{tenant="team-b",kind="completion"} 20
vllm_fleet_door_tokens_total{tenant="team-b",kind="prompt"} 10
vllm_fleet_door_tokens_total{tenant="team-b",kind="streamed"} 7
vllm_fleet_door_tokens_last_minute{tenant="team-a"} 60
vllm_fleet_door_tokens_last_minute{tenant="team-b"} 37
vllm_fleet_door_tokens_per_min_limit{tenant="team-a"} 50
vllm_fleet_door_tokens_per_min_limit{tenant="team-b"} 0
vllm_fleet_door_unknown_key_total 0
"""


def test_tenant_usage_reads_the_doors_counts():
    assert lb.tenant_usage(SERVED) == {
        "team-a": {"requests": 4, "4xx": 2, "tokens": 60, "tokens_60s": 60},
        "team-b": {"requests": 1, "4xx": 0, "tokens": 37, "tokens_60s": 37}}
    assert lb.tenant_usage("") == {}


def test_the_tenants_are_counted_by_the_doors_lua_and_every_refusal_is_counted_before_it_is_sent():
    tenants = [{**TENANTS[0], "tokens_per_min": 5000}, TENANTS[1]]
    b = door(tenants=tenants)
    cfg = render.haproxy_config(b, "/s", "/m")
    assert "lua-load /m/door.lua" in cfg
    edge = cfg.split("frontend door", 1)[1].split("\nbackend ", 1)[0]
    lines = [line.strip() for line in edge.splitlines()]
    for code in ("401", "429", "413", "404", "403", "400"):  # each counted, then answered, same condition
        counted = next(i for i, line in enumerate(lines)
                       if line.startswith(f"http-request lua.vllm_fleet_refused {code} "))
        answer = lines[counted + 1]
        assert answer.startswith(f"http-request return status {code} "), answer
        assert answer.rsplit(" if ", 1)[1] == lines[counted].split(" if ", 1)[1]
    assert "lua.vllm_fleet_tokens_over" in edge and "http-response lua.vllm_fleet_answered" in edge
    # a stream is what vLLM's request model reads as one: its booleans are lax ("true", 1, "yes")
    assert "acl streamed var(txn.stream) -m str -i 1 true t on y yes" in edge
    metrics = cfg.split("frontend metrics", 1)[1].split("\n\n", 1)[0]
    assert "bind 127.0.0.1:8405" in metrics
    assert "use-service prometheus-exporter if { path /metrics }" in metrics
    assert "use-service lua.vllm_fleet_tenant_metrics if { path /metrics/tenants }" in metrics
    lua = render.door_lua(b)
    assert '["team-a"] = 5000,' in lua and '["team-b"] = 0,' in lua
    assert all(name in lua for name in lb.TENANT_METRICS.values())
    # without tenants: no Lua, haproxy's own exporter only; metrics null: no endpoint
    plain = render.haproxy_config(door(), "/s", "/m")
    assert "lua" not in plain and "prometheus-exporter" in plain
    assert "frontend metrics" not in render.haproxy_config(door(metrics=None), "/s", "/m")


def test_the_door_host_reaches_its_own_metrics_endpoint():
    assert lb.metrics_url(door().spec, "/metrics/tenants") == "http://127.0.0.1:8405/metrics/tenants"
    assert lb.metrics_url(door(metrics={"bind": "0.0.0.0", "port": 9100}).spec, "/x") == "http://127.0.0.1:9100/x"
    assert lb.metrics_url(door(metrics={"bind": "::1"}).spec, "/x") == "http://[::1]:8405/x"
    assert lb.metrics_url(door(metrics=None).spec, "/x") is None
