"""The VllmHost fact: one remote command that also carries each vllm unit's systemd state, so a
converged host needs no per-unit `systemctl show`. The sample below is this fact's output captured on
a lab host (lab1, a real systemd host) serving one instance, trimmed to the sections that matter."""

from __future__ import annotations

import subprocess

from roles.facts import VllmHost

CAPTURED_LAB1 = """\
## releases
0.32.0-cpu
## current
/opt/vllm/releases/0.32.0-cpu
## base
user-ok
root:root:755 /opt/vllm/releases
root:root:755 /etc/vllm
vllm:vllm:750 /var/lib/vllm
vllm:vllm:750 /var/lib/vllm/models
root:root:700 /var/lib/vllm-fleet
## unit vllm-chat.service
MainPID=0
NRestarts=0
ActiveState=failed
SubState=failed
UnitFileState=disabled
ActiveEnterTimestampMonotonic=0
## unit vllm-default.service
MainPID=378
NRestarts=0
ActiveState=active
SubState=running
UnitFileState=enabled
ActiveEnterTimestampMonotonic=36399175675
## state
{"current": {"release": "0.32.0-cpu", "instances": ["default"]}}
## addresses
2: host0    inet 10.77.1.2/24 scope global host0\\       valid_lft forever preferred_lft forever
## cgroup2
"""


def test_each_unit_gets_its_own_state_and_the_rest_of_the_fact_is_unchanged():
    found = VllmHost().process(CAPTURED_LAB1.splitlines())
    assert found["units"] == ["vllm-chat.service", "vllm-default.service"]
    assert found["unit_states"]["vllm-default.service"] == {
        "MainPID": "378", "NRestarts": "0", "ActiveState": "active", "SubState": "running",
        "UnitFileState": "enabled", "ActiveEnterTimestampMonotonic": "36399175675"}
    assert found["unit_states"]["vllm-chat.service"]["ActiveState"] == "failed"
    assert found["current"] == "0.32.0-cpu"
    assert found["state"]["current"]["instances"] == ["default"]
    assert found["interfaces"] == {"10.77.1.2": "host0"}
    assert found["base_ok"] is True


def test_the_command_is_valid_shell_and_a_host_without_units_has_no_states():
    # run here, where /etc/systemd/system holds no vllm unit: the loop must simply run zero times
    out = subprocess.run(["sh", "-c", VllmHost().command()], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    found = VllmHost().process(out.stdout.splitlines())
    assert found["units"] == [] and found["unit_states"] == {}
