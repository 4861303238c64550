"""The smoke test sends the key only to the unit's own listener: read from `ss -ltnp` and the
listeners' cgroups in the form the VllmHost fact captured on this project's dev machine (SS_DEV)."""

from __future__ import annotations

from tests.unit.test_startup import SS_DEV
from vllm_fleet.controller.smoke import holder_check
from vllm_fleet.roles.facts import listeners_of, sections_of


def listeners(text: str = SS_DEV) -> list[dict] | None:
    return listeners_of(sections_of(text.splitlines()))


def test_the_units_own_listener_gets_the_key() -> None:
    assert holder_check(listeners(), "127.0.0.1", 8000, "vllm-default.service") is None


def test_a_squatter_on_the_port_gets_no_key_and_is_named() -> None:
    check = holder_check(listeners(), "127.0.0.1", 18555, "vllm-default.service")
    assert check is not None and not check.ok and check.name == "listener"
    assert check.detail == ("port 18555 is held by python3 (pid 31464, no unit) on 127.0.0.1, not "
                            "vllm-default.service: the key was not sent")
    # the port held by another unit, or by this unit's listener plus another one on [::]
    assert "ssh.service" in holder_check(listeners(), "127.0.0.1", 22, "vllm-default.service").detail
    both = SS_DEV.replace("## listen_cgroups", 'LISTEN 0 5 [::]:8000 [::]:* users:(("nc",pid=4242,fd=3))\n'
                          "## listen_cgroups")
    found = holder_check(listeners(both), "127.0.0.1", 8000, "vllm-default.service")
    assert found is not None and "nc (pid 4242, no unit) on ::" in found.detail


def test_no_listener_or_no_ss_sends_no_key() -> None:
    unit = "vllm-default.service"
    assert "nothing listens on port 9000" in holder_check(listeners(), "127.0.0.1", 9000, unit).detail
    no_ss = "## listen\n## listen_cgroups\n"
    assert listeners(no_ss) is None
    assert "cannot tell who holds port 8000" in holder_check(None, "127.0.0.1", 8000, unit).detail


def test_a_listener_at_another_address_cannot_take_the_connection_and_is_left_alone() -> None:
    # another service on the port's public address while vLLM binds loopback: not where the test connects
    other = SS_DEV.replace("## listen_cgroups", "LISTEN 0 5 10.77.1.2:8000 0.0.0.0:* "
                           'users:(("nginx",pid=77,fd=3))\n## listen_cgroups')
    assert holder_check(listeners(other), "127.0.0.1", 8000, "vllm-default.service") is None
    # but a squatter on loopback, when vLLM binds every address (the test dials 127.0.0.1), is refused
    squat = SS_DEV.replace("## listen_cgroups", "LISTEN 0 5 127.0.0.1:8000 0.0.0.0:* "
                           'users:(("nc",pid=78,fd=3))\n## listen_cgroups')
    found = holder_check(listeners(squat), "127.0.0.1", 8000, "vllm-default.service")
    assert found is not None and "nc (pid 78, no unit) on 127.0.0.1" in found.detail
