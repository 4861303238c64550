"""Each host's collection asks hostplan.inventory_specs for its spec; the inventory's secrets check it
makes must cost each host the same whatever the fleet's size (bench/controller_scale.py measures it),
and refuse exactly as before: every missing variable of every host named, until it is set, in every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

from vllm_fleet.roles import hostplan
from vllm_fleet.roles.hostplan import Refused, inventory_specs

M = {"name": "tiny", "host_path": "/srv/models/tiny"}


@contextmanager
def run(names: list[str], data: dict | None = None) -> Iterator[Inventory]:
    """One pyinfra run (a State, so a FleetRun of its own) over `names`, each with vllm data."""
    inventory = Inventory(([(n, {"vllm": data or {"model": M}}) for n in names], {}))
    state = State(inventory, Config())
    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_config.use(state.config):
        yield inventory


def each_host(inventory: Inventory, check_secrets: bool = True) -> None:
    """What every host's collection does: ask for its spec."""
    for h in inventory:
        with ctx_host.use(h):
            assert inventory_specs(check_secrets).get(h.name) is not None


@pytest.fixture
def counted(monkeypatch) -> list[str]:
    """The hosts whose instances the secrets check read, in order."""
    seen: list[str] = []
    real = hostplan.missing_secrets

    def counting(host, inst, environ):
        seen.append(host)
        return real(host, inst, environ)

    monkeypatch.setattr(hostplan, "missing_secrets", counting)
    return seen


def test_a_run_reads_each_hosts_secrets_once_not_once_per_host(monkeypatch, counted) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "k")
    names = [f"h{i}" for i in range(50)]
    with run(names) as inventory:
        each_host(inventory)
    assert sorted(counted) == sorted(names)  # one pass over the inventory, not 50


def test_every_missing_secret_is_refused_on_every_ask_until_it_is_set(monkeypatch, counted) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with run(["a", "b"]) as inventory:
        for h in inventory:
            with ctx_host.use(h), pytest.raises(Refused) as refused:
                inventory_specs()
            assert "a: vllm.instances[default]: VLLM_API_KEY is not set" in str(refused.value)
            assert "b: vllm.instances[default]: VLLM_API_KEY is not set" in str(refused.value)
        monkeypatch.setenv("VLLM_API_KEY", "k")
        counted.clear()
        each_host(inventory)
        assert counted == ["a", "b"]


def test_a_read_only_parse_first_still_leaves_the_check_to_the_deploy(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with run(["a", "b"]) as inventory:
        each_host(inventory, check_secrets=False)  # plan, logs, the load balancer: no secret needed
        with ctx_host.use(inventory.get_host("a")), pytest.raises(Refused, match="VLLM_API_KEY"):
            inventory_specs()


def test_another_run_is_checked_on_its_own(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "k")
    with run(["a"]) as inventory:
        each_host(inventory)
    monkeypatch.delenv("VLLM_API_KEY")
    for data, variable in (({"model": M}, "VLLM_API_KEY"), ({"model": M, "api_key_env": "OTHER"}, "OTHER")):
        with run(["a"], data) as inventory, ctx_host.use(inventory.get_host("a")), \
                pytest.raises(Refused, match=variable):
            inventory_specs()
