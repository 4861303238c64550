"""The README's mixed inventory stays in the shape the lab deploys through: the same login
keys (a user with passwordless sudo, host keys verified), every host valid or left alone by the rule for
mixed inventories. tests/hosts/test_logins.py proves that shape on real hosts."""

from __future__ import annotations

import re
from pathlib import Path

import fleetlab as lab
from fleetlab.inventory import connection
from vllm_fleet.core.spec import is_vllm_host, parse_inventory

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
LOGIN_KEYS = ("ssh_user", "_sudo", "ssh_known_hosts_file", "ssh_strict_host_key_checking")


def _example() -> dict[str, dict]:
    block = re.search(r"```python\n# a mixed inventory[^\n]*\n(.*?)```", README, re.S)
    assert block, "README lost its mixed inventory"
    scope: dict = {}
    exec(block.group(1), scope)  # the README's own text, nothing added
    return {name: data for key, group in scope.items() if key.endswith("_hosts") for name, data in group}


def test_readme_inventory_logs_in_like_the_lab():
    hosts = _example()
    lab_login = connection(lab.LabHost(1))
    assert lab_login["ssh_user"] == "deploy" and lab_login["_sudo"] is True
    for name, data in hosts.items():
        assert {k: data.get(k) for k in ("ssh_user", "_sudo", "ssh_strict_host_key_checking")} == \
            {k: lab_login[k] for k in ("ssh_user", "_sudo", "ssh_strict_host_key_checking")}, name
        assert set(LOGIN_KEYS) <= set(data), name


def test_readme_inventory_is_valid_and_mixed():
    hosts = _example()
    specs = parse_inventory((n, d.get("vllm"), None) for n, d in hosts.items())
    assert sorted(specs) == ["gpu-01", "gpu-02"]
    assert [n for n, d in hosts.items() if not is_vllm_host(d.get("vllm"))] == ["db-01"]
