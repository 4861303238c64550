"""The key guard on real hosts: vLLM's own check skips POST /invocations; with vllm-fleet's middleware
every route but the open ones answers 401 without the key, and the smoke test proved it on each route."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.hosts.conftest import INVENTORY, ROOT, api_get, deploy, on


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


def test_every_restart_checks_every_route(deployed):
    """Every restart probes every route without the key. The test makes its own restarts (a flag
    changed on lab1, then put back) instead of counting on the session's first deploy to start the
    instances: after `make demo`, or a previous session, that deploy has nothing to change."""
    for flags in ({"max_num_seqs": 6}, None):  # the change, then the inventory's own config again
        run = deploy(overrides={"lab1": {"flags": flags}} if flags else None, limit="lab1")
        assert run.rc == 0, run.output[-4000:]
        checks = [c for r in run.smoke if r["changed"] for c in r["checks"] if c["name"] == "no-key-401"]
        assert checks, run.output[-3000:]
        for c in checks:
            m = re.fullmatch(r"401 on (\d+)/(\d+) routes", c["detail"])
            assert c["ok"] and m and m.group(1) == m.group(2) and int(m.group(1)) >= 20, c
        assert re.search(r"ok \(401 on \d+/\d+ routes\)", run.output)


# A local user's server that takes the port the moment it is free and records every request's headers:
# what a squatter on the port would learn. It answers 200 to everything, /health included.
SQUATTER = r"""
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        open(sys.argv[2], "a").write(repr(dict(self.headers)) + "\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    do_POST = do_GET
while True:
    try:
        server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
        break
    except OSError:
        time.sleep(0.02)
server.serve_forever()
"""


@contextlib.contextmanager
def squatting(h: str, stop_vllm: bool = False) -> Iterator[str]:
    """A local user's process (nobody) waiting to take port 8000, logging every request's headers;
    yields the instance's key. Afterwards the squatter is gone and the instance serves again."""
    key = on(h, "sed -n 's/^VLLM_API_KEY=//p' /etc/vllm/default.env").strip().strip('"')
    assert len(key) > 8
    on(h, "systemctl stop vllm-watchdog@default.timer" + (" vllm-default.service" if stop_vllm else ""))
    try:
        on(h, "install -d -o nobody -m 700 /tmp/squat && "
              "systemd-run --unit=squatter --uid=nobody --property=PrivateTmp=no python3 -c "
              f"{shlex.quote(SQUATTER)} 8000 /tmp/squat/headers.log")
        yield key
        seen = on(h, "cat /tmp/squat/headers.log 2>/dev/null")
        assert key not in seen and "Bearer" not in seen, seen
    finally:
        on(h, "systemctl stop squatter.service 2>/dev/null; rm -rf /tmp/squat; "
              "systemctl restart vllm-default.service; systemctl start vllm-watchdog@default.timer")
    for _ in range(60):
        if api_get(h, "/v1/models")[0] == 200:
            break
        time.sleep(3)
    assert api_get(h, "/v1/models")[0] == 200


def test_a_local_user_who_takes_the_port_during_a_restart_never_receives_the_key(deployed, lab_hosts):
    """A restart leaves the instance's port free until the new vLLM binds it; a local user's process
    waiting for that moment takes it. The smoke test after the restart (and the rollback's) reads who
    holds the port (ss, the holder's cgroup) before any request with the key, so the key never leaves."""
    h = lab_hosts[0]
    with squatting(h):
        run = deploy(overrides={h: {"flags": {"max_num_seqs": 4}}}, limit=h)  # a change: a restart
        assert run.rc != 0, run.output[-3000:]
        assert re.search(r"port 8000 is held by python3 \(pid \d+, squatter.service\) on 127.0.0.1, not "
                         r"vllm-default.service: the key was not sent", run.output), run.output[-3000:]
        assert "ActiveState=active" in on(h, "systemctl show squatter.service -p ActiveState")
    assert "max-num-seqs: 8" in on(h, "cat /etc/vllm/default.yaml")  # the rollback's config, serving


def test_status_while_a_local_user_holds_the_port_never_sends_the_key(deployed, lab_hosts):
    """`vllm-fleet status` reads /metrics with the key for its live figures. With vLLM stopped and a local
    user's process on its port, the plan already names the holder (it reads the host's listeners), and
    the squatter receives no key. A port taken after that read is the smoke test's holder check's to
    refuse; that race is staged in tests/unit/test_smoke_role_key.py."""
    h = lab_hosts[0]
    with squatting(h, stop_vllm=True):
        for _ in range(100):
            if "127.0.0.1:8000 " in on(h, "ss -Htln"):
                break
            time.sleep(0.1)
        status = subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "status", INVENTORY,
                                 "--limit", h], cwd=ROOT, env=os.environ, text=True, capture_output=True,
                                timeout=600)
        out = status.stdout + status.stderr
        assert re.search(r"8000 on 127.0.0.1 is already listened on by python3 \(pid \d+, squatter.service\)",
                         out), out[-3000:]
