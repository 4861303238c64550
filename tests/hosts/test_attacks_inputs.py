"""The security review's input attacks through the real deploy (items 3, 4, 5, 13): each is refused
before any operation runs and leaves lab2's files as they were; a normal deploy keeps every env value
out of the unit and in the 0600 env file."""

from __future__ import annotations

import pytest

from fleetlab.inventory import lab_vllm
from tests.hosts.conftest import deploy, host_files_digest, on
from vllm_fleet.core.spec import SpecError, parse_inventory

ATTACKS = [
    ("list items smuggling flags",
     {"flags": {"extra_args": {"tool-call-parser": ["hermes", "--host", "0.0.0.0", "--trust-remote-code"]}}},
     "lab2: vllm.instances[default].flags.extra_args.tool-call-parser: '--host' starts with '-'"),
    ("a NUL in an env value",
     {"env": {"OMP_WAIT_POLICY": "x\x00User=root\x00X-Pad="}},
     "lab2: vllm.env.OMP_WAIT_POLICY: contains the non-printable character '\\x00'"),
    ("vLLM's dev mode", {"env": {"VLLM_SERVER_DEV_MODE": "1"}},
     "lab2: vllm.instances[default].env.VLLM_SERVER_DEV_MODE: opens vLLM's development routes"),
]


@pytest.fixture(scope="module")
def before(deployed):
    return host_files_digest("lab2")


@pytest.mark.parametrize(("desc", "over", "line"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_refused_before_anything_changes(before, desc, over, line):
    run = deploy(overrides={"lab2": over})
    assert run.rc != 0
    assert line in run.output, run.output[-3000:]
    assert "Beginning operation run" not in run.output
    assert "User=root" not in on("lab2", "cat /etc/systemd/system/vllm-default.service")
    assert host_files_digest("lab2") == before


def test_a_host_name_with_a_newline_is_refused_by_the_planner():
    """The lab's host names come from its state (lab1, lab2), so a renamed host cannot be deployed here:
    the refusal is shown where the inventory is parsed, which every deploy goes through first."""
    with pytest.raises(SpecError, match="inventory host name"):
        parse_inventory([("lab2\nUser=root", lab_vllm(2), None)])


def test_env_values_are_only_in_the_0600_env_files(deployed, lab_hosts):
    for h in lab_hosts:
        shown = on(h, "systemctl show vllm-default.service -p Environment").strip()
        assert shown == "Environment=", shown
        assert "Environment=" not in on(h, "grep -E '^Environment=' /etc/systemd/system/vllm-default.service"
                                           "; true")
        for f in ("default.env", "default.environment"):
            assert on(h, f"stat -c %a:%U:%G /etc/vllm/{f}").strip() == "600:root:root"
        env = on(h, "cat /etc/vllm/default.environment")
        for line in ('OMP_WAIT_POLICY="PASSIVE"', 'VLLM_HOST_IP="127.0.0.1"', 'HF_HUB_OFFLINE="1"'):
            assert line in env.splitlines(), env
        # the keys' file holds the keys only, and no key is in the settings' file
        keys = [line.split("=", 1)[0] for line in on(h, "cat /etc/vllm/default.env").splitlines()
                if line and not line.startswith("#")]
        assert keys == ["VLLM_API_KEY"], keys
        assert "VLLM_API_KEY" not in env
        # the process has them, read by systemd from the file
        pid = on(h, "systemctl show -p MainPID --value vllm-default.service").strip()
        assert "OMP_WAIT_POLICY=PASSIVE" in on(h, f"tr '\\0' '\\n' < /proc/{pid}/environ")


def test_the_manifest_reports_no_digest_of_the_env_file(deployed, lab_hosts):
    for h in lab_hosts:
        digest = on(h, "sha256sum /etc/vllm/default.env").split()[0]
        assert on(h, "stat -c %a:%U:%G /etc/vllm/.default.env.hmac").strip() == "600:root:root"
        run = deploy(limit=h, extra=("-vvv",))
        assert run.rc == 0, run.output[-3000:]
        assert digest not in run.output
        # the marker matches: a rerun with the same key writes nothing
        assert not [name for name in run.changed_ops() if "default.env" in name], run.changed_ops()
