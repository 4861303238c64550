"""A bench trial server is the same untrusted vLLM as the serving unit: it gets that unit's sandbox.

The properties are read off the rendered unit (vllm_fleet.core.render.sandbox_properties), so these tests pin
that
nothing confining is lost on the way, that the trial's systemd-run carries every one, and that systemd-run
itself parses each as a transient property (against a throwaway D-Bus: no systemd needed).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.unit.test_render import M, make_plan
from vllm_fleet.core import render
from vllm_fleet.core.benchmark import BenchSettings, Trial
from vllm_fleet.roles.bench import client_command, trial_script

DATA = {"model": M, "api_key_env": "FLEET_KEY"}


def plans():
    return {"gpu": make_plan(DATA), "cpu": make_plan({**DATA, "accelerator": "cpu"}, n_gpus=0)}


def service_lines(unit: str) -> list[str]:
    body = unit.split("[Service]\n", 1)[1].split("\n[", 1)[0]
    return [line for line in body.splitlines() if line and not line.startswith("#")]


def sandbox_lines() -> list[str]:
    text = render.environment().get_template("sandbox.j2").render()
    return [line for line in text.splitlines() if "=" in line]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_properties_are_the_units_own_lines_in_order(kind):
    p = plans()[kind]
    props = render.sandbox_properties(p, p.instances[0])
    unit = service_lines(render.unit(p, p.instances[0]))
    assert props == [line for line in unit if line in props]
    # every line of the shared hardening, once, as the unit has it
    assert [line for line in props if line in sandbox_lines()] == sandbox_lines()
    assert "ReadWritePaths=/var/lib/vllm" in props
    assert "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK" in props
    # nothing that is not confinement: who it runs as, what it runs, its secrets
    assert not [line for line in props if line.split("=", 1)[0] in
                ("User", "ExecStart", "EnvironmentFile", "Environment", "Restart", "Type")]


def test_device_rules_follow_the_variant():
    by = {k: render.sandbox_properties(p, p.instances[0]) for k, p in plans().items()}
    assert "PrivateDevices=yes" in by["cpu"] and not [x for x in by["cpu"] if x.startswith("Device")]
    assert "PrivateDevices=yes" not in by["gpu"]
    assert "DevicePolicy=closed" in by["gpu"]
    assert {"DeviceAllow=/dev/nvidia0 rw", "DeviceAllow=/dev/nvidia1 rw",
            "DeviceAllow=/dev/nvidiactl rw"} <= set(by["gpu"])


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_trial_server_runs_with_every_property(kind):
    p = plans()[kind]
    inst = p.instances[0]
    start = next(line for line in trial_script(p, inst, Trial(1024).flags(), 18000,
                                                 client_command(p, inst, 18000, BenchSettings())).splitlines()
                 if line.startswith("systemd-run") and "vllm-bench-trial" in line)
    argv = shlex.split(start)
    given = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert given[:4] == ["User=vllm", "Group=vllm", "WorkingDirectory=/var/lib/vllm", "KillMode=mixed"]
    assert given[4] == f"RuntimeMaxSec={3600 + p.ready_timeout_s}"
    assert given[5:-2] == render.sandbox_properties(p, inst)
    assert given[-2:] == [f"EnvironmentFile={inst.environment_path}", f"EnvironmentFile={inst.env_path}"]
    assert argv[argv.index("serve") - 1].endswith("/bin/vllm")


_BUS = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>unix:path={path}</listen><auth>EXTERNAL</auth>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/>
<allow own="*"/></policy></busconfig>
"""


@pytest.fixture
def fake_user_bus(tmp_path: Path):
    """A bare D-Bus with no systemd behind it: `systemd-run --user` parses each -p on its side (it fails
    with "Unknown assignment" or "Failed to parse"), then fails to reach a manager."""
    if not (shutil.which("dbus-daemon") and shutil.which("systemd-run")):
        pytest.skip("needs dbus-daemon and systemd-run")
    sock = tmp_path / "bus"
    conf = tmp_path / "bus.conf"
    conf.write_text(_BUS.format(path=sock))
    daemon = subprocess.Popen(["dbus-daemon", "--nofork", f"--config-file={conf}"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        (tmp_path / "xdg").mkdir()
        yield {**os.environ, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={sock}",
               "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    finally:
        daemon.terminate()
        daemon.wait(timeout=5)


def _rejection(env: dict[str, str], prop: str) -> str | None:
    out = subprocess.run(["systemd-run", "--user", "--quiet", "-p", prop, "/bin/true"], env=env,
                         capture_output=True, text=True, timeout=10)
    err = out.stderr.strip()
    return None if "Failed to start transient" in err else err or f"rc {out.returncode}, no message"


def test_fake_bus_tells_an_unknown_property(fake_user_bus):
    """The check below can fail: a made-up key and a bad value are refused."""
    assert "Unknown assignment" in (_rejection(fake_user_bus, "NoSuchSetting=yes") or "")
    assert "Failed to parse" in (_rejection(fake_user_bus, "NoNewPrivileges=maybe") or "")


def test_systemd_run_accepts_every_property_as_transient(fake_user_bus):
    """A node group's worker too: its unit file's `IPAddressAllow=localhost ...` is refused by
    systemd-run ("Failed to parse IP address prefix: localhost"), so the words become prefixes."""
    from tests.unit.test_cluster import plans as cluster_plans

    worker = cluster_plans()["gpu-b"]
    every = [*plans().values(), worker]
    props = {x for p in every for x in render.sandbox_properties(p, p.instances[0])}
    assert "IPAddressAllow=127.0.0.0/8 ::1/128 10.1.0.11 10.1.0.12" in props
    assert "IPAddressDeny=0.0.0.0/0 ::/0" in props
    refused = {x: why for x in sorted(props) if (why := _rejection(fake_user_bus, x))}
    assert not refused
