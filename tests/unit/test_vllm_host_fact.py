"""The VllmHost fact: one remote command that also carries each vllm unit's systemd state, so a
converged host needs no per-unit `systemctl show`. The sample below is this fact's output captured on
a lab host (lab1, a real systemd host) serving one instance, trimmed to the sections that matter; its
models line is the /opt/vllm/models layout's (the capture predates it)."""

from __future__ import annotations

import subprocess

from vllm_fleet.roles.facts import VllmHost

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
root:vllm:750 /opt/vllm/models
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
    # a host deployed before models moved to root-owned /opt/vllm/models gets its directories again
    old = VllmHost().process(CAPTURED_LAB1.replace("root:vllm:750 /opt/vllm/models",
                                                   "vllm:vllm:750 /var/lib/vllm/models").splitlines())
    assert old["base_ok"] is False


def test_the_command_is_valid_shell_and_a_host_without_units_has_no_states():
    # run here, where /etc/systemd/system holds no vllm unit: the loop must simply run zero times
    out = subprocess.run(["sh", "-c", VllmHost().command()], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    found = VllmHost().process(out.stdout.splitlines())
    assert found["units"] == [] and found["unit_states"] == {}


# --- ports: what vllm_fleet.core.startup needs to tell whether vLLM can bind its port
# The new sections as this fact's command printed them on the project's dev machine (cgroup v1, a
# python3 http.server started for the capture, a listener whose process ss cannot show); ss pads its
# columns with trailing blanks, trimmed here.
CAPTURED_DEV_PORTS = """\
## unprivileged_port_start
1024
## listen
State  Recv-Q Send-Q Local Address:Port  Peer Address:PortProcess
LISTEN 0      5          127.0.0.1:18555      0.0.0.0:*    users:(("python3",pid=31464,fd=3))
LISTEN 0      16         127.0.0.1:46201      0.0.0.0:*    users:(("pyinfra",pid=31232,fd=6))
LISTEN 0      128          0.0.0.0:2024       0.0.0.0:*
## listen_cgroups
31232 9:name=systemd:/
31464 9:name=systemd:/
"""

# ss's address forms (IPv4 with a scope, IPv6-only "[::]", dual-stack "*", an IPv4-mapped address) and
# /proc/<pid>/cgroup lines in the cgroup v2 form systemd writes, vllm units and user services included.
SYSTEMD_PORTS = """\
## unprivileged_port_start
80
## listen
State  Recv-Q Send-Q      Local Address:Port  Peer Address:PortProcess
LISTEN 0      4096        127.0.0.53%lo:53         0.0.0.0:*    users:(("systemd-resolve",pid=642,fd=14))
LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:* users:(("vllm",pid=378,fd=27),("python3",pid=380,fd=27))
LISTEN 0      128                [::]:22              [::]:*    users:(("sshd",pid=901,fd=4))
LISTEN 0      4096                  *:9100               *:*    users:(("node_exporter",pid=700,fd=3))
LISTEN 0      511  [::ffff:127.0.0.1]:8080               *:*    users:(("node",pid=1500,fd=20))
## listen_cgroups
378 0::/system.slice/vllm-default.service
642 0::/system.slice/systemd-resolved.service
700 0::/system.slice/prometheus-node-exporter.service
901 0::/system.slice/ssh.service
1500 0::/user.slice/user-1000.slice/user@1000.service/app.slice/dev-server.service
"""


def test_listeners_from_a_real_ss_capture() -> None:
    found = VllmHost().process(CAPTURED_DEV_PORTS.splitlines())
    assert found["unprivileged_port_start"] == 1024
    assert found["listeners"] == [
        {"address": "127.0.0.1", "port": 18555, "process": "python3", "pid": 31464, "unit": None},
        {"address": "127.0.0.1", "port": 46201, "process": "pyinfra", "pid": 31232, "unit": None},
        {"address": "0.0.0.0", "port": 2024, "process": None, "pid": None, "unit": None},
    ]


def test_listeners_name_their_systemd_unit_and_address_form() -> None:
    found = VllmHost().process(SYSTEMD_PORTS.splitlines())
    assert found["unprivileged_port_start"] == 80
    by_port = {li["port"]: li for li in found["listeners"]}
    assert by_port[53]["address"] == "127.0.0.53%lo" and by_port[53]["unit"] == "systemd-resolved.service"
    assert by_port[8000] == {"address": "0.0.0.0", "port": 8000, "process": "vllm", "pid": 378,
                             "unit": "vllm-default.service"}
    assert by_port[22]["address"] == "::" and by_port[9100]["address"] == "*"
    assert by_port[8080]["address"] == "::ffff:127.0.0.1"
    assert by_port[8080]["unit"] == "dev-server.service"  # the innermost service, not user@1000.service


def test_ports_unknown_without_ss_or_on_an_older_fact() -> None:
    no_ss = VllmHost().process(["## unprivileged_port_start", "## listen", "## listen_cgroups"])
    assert no_ss["unprivileged_port_start"] is None and no_ss["listeners"] is None
    lab = VllmHost().process(CAPTURED_LAB1.splitlines())  # a capture from before these sections
    assert lab["unprivileged_port_start"] is None and lab["listeners"] is None
    header_only = VllmHost().process(["## listen", "State  Recv-Q Send-Q Local Address:Port  Peer"])
    assert header_only["listeners"] == []  # ss ran and nothing listens


def test_host_ports_from_the_fact() -> None:
    from vllm_fleet.core.startup import HostPorts, Listener

    fact = VllmHost().process((CAPTURED_LAB1 + SYSTEMD_PORTS).splitlines())
    ports = HostPorts.from_fact(fact)
    assert ports.unprivileged_port_start == 80 and ports.addresses == frozenset({"10.77.1.2"})
    assert ports.listeners is not None
    assert Listener("0.0.0.0", 8000, "vllm", 378, "vllm-default.service") in ports.listeners
    assert [li.port for li in ports.listeners if li.ours] == [8000]
    assert HostPorts.from_fact({}).listeners is None


def test_the_command_reads_the_ports_here() -> None:
    out = subprocess.run(["sh", "-c", VllmHost().command()], capture_output=True, text=True, timeout=30)
    found = VllmHost().process(out.stdout.splitlines())
    assert isinstance(found["unprivileged_port_start"], int)
    assert found["listeners"] is None or all(isinstance(li["port"], int) for li in found["listeners"])


# --- which units this toolkit created: the only ones a deploy removes ------------------------------------

UNITS = """\
## unit vllm-default.service
ActiveState=active
## unit vllm-router.service
ActiveState=active
## managed
vllm-default.service
## state
"""


def test_created_units_are_those_the_host_state_records():
    state = '{"current": {"created": ["default", "second"]}, "previous": {"created": ["old"]}}'
    found = VllmHost().process((UNITS + state).splitlines())
    assert found["units"] == ["vllm-default.service", "vllm-router.service"]
    assert found["created"] == ["vllm-default.service", "vllm-old.service", "vllm-second.service"]


def test_a_state_from_before_the_record_falls_back_to_the_header():
    found = VllmHost().process((UNITS + '{"current": {"instances": ["default"]}}').splitlines())
    assert found["created"] == ["vllm-default.service"]
    assert VllmHost().process(UNITS.splitlines())["created"] == ["vllm-default.service"]  # no state
    assert VllmHost().process(CAPTURED_LAB1.splitlines())["created"] == []  # an older fact: nothing


def test_the_command_lists_only_units_whose_first_line_is_the_header(tmp_path):
    (tmp_path / "vllm-default.service").write_text("# Managed by vllm-fleet: edits here are overwritten.\n")
    (tmp_path / "vllm-router.service").write_text("[Unit]\n# Managed by vllm-fleet\n")
    (tmp_path / "vllm-watchdog@default.service").write_text("# Managed by vllm-fleet\n")
    command = VllmHost().command().replace("/etc/systemd/system", str(tmp_path))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    found = VllmHost().process(out.stdout.splitlines())
    assert found["units"] == ["vllm-default.service", "vllm-router.service"]
    assert found["created"] == ["vllm-default.service"]


def test_uv_version_is_read_from_its_own_output_and_absent_is_none():
    # `uv --version` as uv 0.13.9 prints it on a lab host
    text = CAPTURED_LAB1.replace("## addresses", "## uv\nuv 0.13.9 (x86_64-unknown-linux-gnu)\n## addresses")
    assert VllmHost().process(text.splitlines())["uv"] == "0.13.9"
    assert VllmHost().process(CAPTURED_LAB1.splitlines())["uv"] is None
    empty = CAPTURED_LAB1.replace("## cgroup2", "## uv\n## cgroup2")
    assert VllmHost().process(empty.splitlines())["uv"] is None


def test_the_host_side_scripts_name_the_planners_paths():
    """hoststate.py imports nothing of ours (stdlib only on the host): its copies must stay equal."""
    from vllm_fleet.core import layout as plan
    from vllm_fleet.host import hoststate

    assert (hoststate.RELEASES, hoststate.CURRENT, hoststate.MODELS, hoststate.UV, hoststate.STATE_DIR,
            hoststate.CONFIG_DIR, hoststate.WHEELS) == (plan.RELEASES_DIR, plan.CURRENT_LINK, plan.MODELS_DIR,
                                                        plan.UV_PATH, plan.FLEET_STATE, plan.CONFIG_DIR,
                                                        plan.HOST_WHEELS)
