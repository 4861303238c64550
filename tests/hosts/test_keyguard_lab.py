"""The key guard on real hosts: vLLM's own check skips POST /invocations; with vllm-fleet's middleware
every route but the open ones answers 401 without the key, and the smoke test proved it on each route."""

from __future__ import annotations

import json
import re

from tests.hosts.conftest import api_get, on


def _post(host: str, path: str, body: dict, with_key: bool) -> int:
    """POST on the host's loopback; the key is read there from the env file, never put in an argv."""
    script = (
        "import json, urllib.request, urllib.error\n"
        "env = dict(l.split('=', 1) for l in open('/etc/vllm/default.env') if '=' in l)\n"
        "key = env['VLLM_API_KEY'].strip().strip(chr(34))\n"
        f"headers = {{'Content-Type': 'application/json'}}\n"
        f"if {with_key!r}:\n    headers['Authorization'] = 'Bearer ' + key\n"
        f"req = urllib.request.Request('http://127.0.0.1:8000{path}', data={json.dumps(body).encode()!r}, "
        "headers=headers, method='POST')\n"
        "try:\n    print(urllib.request.urlopen(req, timeout=60).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    return int(on(host, "python3 -", stdin=script).strip() or 0)


def _get_without_key(host: str, path: str) -> int:
    script = ("import urllib.request, urllib.error\n"
              "try:\n"
              f"    print(urllib.request.urlopen('http://127.0.0.1:8000{path}', timeout=30).status)\n"
              "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    return int(on(host, "python3 -", stdin=script).strip() or 0)


def test_invocations_needs_the_key(deployed, lab_hosts):
    h = lab_hosts[0]
    served = json.loads(api_get(h, "/v1/models")[1])["data"][0]["id"]
    body = {"model": served, "prompt": "The fleet is", "max_tokens": 2, "temperature": 0}
    assert _post(h, "/invocations", body, with_key=False) == 401
    assert _post(h, "/invocations", body, with_key=True) == 200
    assert _post(h, "/scale_elastic_ep", {}, with_key=False) == 401


def test_only_the_open_paths_answer_without_the_key(deployed, lab_hosts):
    h = lab_hosts[0]
    assert _get_without_key(h, "/health") == 200
    for path in ("/metrics", "/openapi.json", "/docs", "/v1/models", "/health/"):
        assert _get_without_key(h, path) == 401, path
    assert api_get(h, "/metrics")[0] == 200  # with the key


def test_the_unit_loads_the_guard(deployed, lab_hosts):
    h = lab_hosts[0]
    assert "middleware: vllm_fleet_keyguard.KeyGuard" in on(h, "cat /etc/vllm/default.yaml")
    assert on(h, "stat -c %a:%U /usr/local/lib/vllm-fleet/asgi/vllm_fleet_keyguard.py").strip() == "755:root"
    assert on(h, "ls /usr/local/lib/vllm-fleet/asgi").split() == ["vllm_fleet_keyguard.py"]


def test_the_smoke_test_checked_every_route(deployed):
    """The session's first deploy starts every instance, and every restart probes every route."""
    checks = [c for r in deployed.smoke if r["changed"] for c in r["checks"] if c["name"] == "no-key-401"]
    assert checks, deployed.output[-3000:]
    for c in checks:
        m = re.fullmatch(r"401 on (\d+)/(\d+) routes", c["detail"])
        assert c["ok"] and m and m.group(1) == m.group(2) and int(m.group(1)) >= 20, c
    assert re.search(r"ok \(401 on \d+/\d+ routes\)", deployed.output)
