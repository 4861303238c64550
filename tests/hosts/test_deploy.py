"""Issue 2's proof on real hosts: deploy, idempotent rerun, a changed flag, a refused deploy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.hosts.conftest import INVENTORY, ROOT, api_get, deploy, host_files_digest, on, unit_props

VLLM_FLEET = str(Path(sys.executable).parent / "vllm-fleet")


def test_first_deploy_serves_on_both_hosts(deployed, lab_hosts):
    assert sorted(r["host"] for r in deployed.smoke) == ["lab1", "lab2"]
    for r in deployed.smoke:
        assert r["ok"], r
        names = {c["name"]: c for c in r["checks"]}
        # a restart adds the start-up log check (on hosts this session did not boot, nothing restarts)
        assert set(names) == {"health", "models", "completion", "no-key-401"} | ({"config"} if r["changed"]
                                                                                 else set())
        assert names["completion"]["detail"] == "4 tokens"
        if r["changed"]:  # the start-up log confirmed every setting that differs from vLLM's defaults
            assert names["config"]["ok"] and names["config"]["detail"].endswith("in the log")
    for h in lab_hosts:
        assert unit_props(h)["ActiveState"] == "active"
        assert on(h, "readlink /opt/vllm/current").strip() == "releases/0.32.0-cpu"
        assert on(h, "stat -c %a:%U /etc/vllm/default.env").strip() == "600:root"
    assert "HOST" in deployed.output and "tiny-llama" in deployed.output


def test_rerun_changes_nothing_and_restarts_nothing(deployed, lab_hosts):
    converged = deploy()  # whatever an earlier module left: this test's own starting point
    assert converged.rc == 0, converged.output[-4000:]
    before = {h: unit_props(h) for h in lab_hosts}
    run = deploy()
    assert run.rc == 0, run.output[-4000:]
    assert run.changed_ops() == [], run.changed_ops()
    after = {h: unit_props(h) for h in lab_hosts}
    for h in lab_hosts:
        assert after[h]["MainPID"] == before[h]["MainPID"]
        assert after[h]["ActiveEnterTimestampMonotonic"] == before[h]["ActiveEnterTimestampMonotonic"]
    assert all(r["ok"] for r in run.smoke)


def test_a_rerun_that_meets_its_instance_restarting_waits_for_it(deployed, lab_hosts):
    """Restarted just before a no-change run (an operator, the watchdog): the port is free until the new
    vLLM binds it. The run did not restart the instance itself, so it checks first; a first round that
    found nothing listening is a restart under way, waited for as after the run's own restart."""
    h = lab_hosts[0]
    assert deploy(limit=h).rc == 0
    before = unit_props(h)["MainPID"]
    on(h, "systemctl restart vllm-default.service")  # returns at exec: vLLM binds its port seconds later
    assert ":8000 " not in on(h, "ss -Htln"), "vLLM listened at once: this test shows nothing"
    run = deploy(limit=h)
    assert run.rc == 0, run.output[-4000:]
    assert run.changed_ops() == [], run.changed_ops()
    assert "nothing listens" not in run.output
    assert [r["ok"] for r in run.smoke] == [True]
    assert unit_props(h)["MainPID"] != before  # the restart the run met, not one of its own


def test_dry_diff_shows_the_config_change_hides_the_key_and_changes_nothing(deployed, lab_hosts):
    host = "lab1"  # the deploy's sudo login: the host's copy is read through sudo, as the upload writes it
    owned = ("find /var/lib/vllm-fleet -type f | sort | xargs -r sha256sum; "
             "stat -c '%n %s %Y' /var/lib/vllm-fleet/*")
    before = (host_files_digest(host), on(host, owned), unit_props(host))
    old_key = on(host, "cat /etc/vllm/default.env")
    new_key = "sk-diff-" + os.urandom(8).hex()
    run = deploy(overrides={host: {"flags": {"max_num_seqs": 4}}}, extra=("--dry", "--diff"), limit=host,
                 env={"VLLM_API_KEY": new_key}, yes=False)  # -y would skip change detection
    assert run.rc == 0, run.output[-4000:]
    text = re.sub(r"\x1b\[[0-9;]*m", "", run.output)
    assert re.search(r"^\s*- max-num-seqs: 8$", text, re.M), text[-4000:]
    assert re.search(r"^\s*\+ max-num-seqs: 4$", text, re.M), text[-4000:]
    assert "/etc/vllm/default.env: changed (secret, not shown)" in text
    assert new_key not in text
    assert all(line not in text for line in old_key.splitlines() if "KEY" in line)
    assert (host_files_digest(host), on(host, owned), unit_props(host)) == before  # --dry wrote nothing
    # `vllm-fleet plan --diff` prints the plan table, then the same diff
    plan = subprocess.run([VLLM_FLEET, "plan", INVENTORY, "--limit", host, "--diff"], cwd=ROOT, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "VLLM_API_KEY": new_key,
                          "VLLM_FLEET_TEST_OVERRIDES": json.dumps({host: {"flags": {"max_num_seqs": 4}}})})
    text = re.sub(r"\x1b\[[0-9;]*m", "", plan.stdout + plan.stderr)
    assert plan.returncode == 0, text[-4000:]
    assert re.search(r"^lab1 +cpu ", text, re.M) and re.search(r"^\s*\+ max-num-seqs: 4$", text, re.M), text
    assert new_key not in text
    assert (host_files_digest(host), on(host, owned), unit_props(host)) == before


def test_missing_api_key_is_refused_before_any_host_is_touched(deployed, lab_hosts):
    before = {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in lab_hosts}
    run = deploy(unset=("VLLM_API_KEY",))
    assert run.rc != 0
    assert "VLLM_API_KEY is not set" in run.output
    assert "lab1" in run.output and "nothing was changed" in run.output
    assert "Beginning operation run" not in run.output
    for h in lab_hosts:
        assert (host_files_digest(h), unit_props(h)["MainPID"]) == before[h]


# several non-default flags of each kind: booleans off (vLLM's default on) and on, integers, an
# extra_args integer and an extra_args boolean off
CHANGED = {"max_model_len": 384, "max_num_seqs": 4, "max_num_batched_tokens": 512, "block_size": 32,
           "enable_prefix_caching": False, "enable_chunked_prefill": False, "enforce_eager": True,
           "extra_args": {"seed": 7, "enable-log-requests": False}}


def test_changed_flags_restart_only_that_host_and_are_what_vllm_runs_with(deployed, lab_hosts):
    before = {h: unit_props(h) for h in lab_hosts}
    # vLLM's CPU backend runs an fp8 KV cache with AVX-512 or AMX only (the plan refuses it elsewhere)
    fp8 = bool({"avx512f", "amx_tile"} & set(on("lab2", "grep -m1 '^flags' /proc/cpuinfo").split()))
    run = deploy(overrides={"lab2": {"flags": {**CHANGED, **({"kv_cache_dtype": "fp8"} if fp8 else {})}}})
    assert run.rc == 0, run.output[-4000:]
    after = {h: unit_props(h) for h in lab_hosts}
    assert after["lab1"]["MainPID"] == before["lab1"]["MainPID"]
    assert after["lab2"]["MainPID"] != before["lab2"]["MainPID"]
    config = on("lab2", "cat /etc/vllm/default.yaml")
    assert "max-model-len: 384" in config and "no-enable-prefix-caching: true" in config
    # the deploy's own check of the start-up log passed, and it is in the smoke table
    lab2 = next(r for r in run.smoke if r["host"] == "lab2")
    check = next(c for c in lab2["checks"] if c["name"] == "config")
    assert check["ok"], check
    # our own reading of the engine's effective config, from the journal of this start
    log = on("lab2", "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID "
                     "--value vllm-default) | grep -E 'non-default args|with config:'")
    for effective in ("enable_prefix_caching=False", "enable_chunked_prefill=False", "enforce_eager=True",
                      "max_seq_len=384", "seed=7") + (("kv_cache_dtype=fp8",) if fp8 else ()):
        assert effective in log, effective
    for parsed in ("'max_num_seqs': 4", "'max_num_batched_tokens': 512", "'block_size': 32"):
        assert parsed in log, parsed
    # off is vLLM's default for request logging: not among the non-default args, and not turned on
    assert "'enable_log_requests': True" not in log
    # live: the running server reports the new context length through its API
    status, body = api_get("lab2", "/v1/models")
    assert status == 200
    assert json.loads(body)["data"][0]["max_model_len"] == 384
    assert "max-model-len: 512" in on("lab1", "cat /etc/vllm/default.yaml")


def test_memory_preflight_matches_what_vllm_logged_on_the_lab_host(deployed):
    """vllm_fleet/core/sizing.py's CPU estimate for the tiny model against the KV cache vLLM reports at
    start."""
    import re

    from fleetlab.inventory import TINY_MODEL, lab_vllm
    from vllm_fleet.core.modelinfo import load
    from vllm_fleet.core.sizing import estimate_cpu

    spec = lab_vllm(1)
    est = estimate_cpu(load(TINY_MODEL), spec["flags"]["max_model_len"], spec["flags"]["max_num_seqs"],
                       spec["cpu_kvcache_gib"], spec["flags"]["dtype"])
    journal = on("lab1", "journalctl -u vllm-default --no-pager -o cat | grep 'CPU KV cache size' | tail -1")
    logged = int(re.search(r"CPU KV cache size: ([\d,]+) tokens", journal).group(1).replace(",", ""))
    print(f"preflight: {est.kv_capacity_tokens:,} tokens; vLLM logged: {logged:,} tokens")
    assert est.kv_capacity_tokens == logged
