"""What an operator sees when something is wrong before any host is reached: one line naming the file,
the line and what to fix, never a traceback, from every command that loads an inventory."""

from __future__ import annotations

import subprocess
import sys

import pytest

BROKEN = {
    "syntax": ('web = [("a", {"vllm": {}})\n', "line 1: SyntaxError: '[' was never closed"),
    "import": ('hosts = ["a"]\nimport no_such_module_here\n',
               "line 2: ModuleNotFoundError: No module named 'no_such_module_here'"),
    "raise": ('hosts = ["a"]\n\nraise ValueError("bad host list")\n', "line 3: ValueError: bad host list"),
}


@pytest.mark.parametrize(("cmd", "case"), [("plan", c) for c in sorted(BROKEN)]
                         + [(c, "import") for c in ("status", "rollout", "rollback", "stage")])
def test_an_inventory_that_fails_to_load_is_one_line_naming_file_and_line(tmp_path, case, cmd):
    text, said = BROKEN[case]
    inv = tmp_path / "inv.py"
    inv.write_text(text)
    out = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", cmd, str(inv)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert f"cannot load inventory {inv}: {said}" in out.stderr


def test_the_public_api_is_every_deploy_under_one_scheme():
    """`from vllm_fleet import …` gives the deploys, each documented with what it reads and an example;
    importing the package alone loads no pyinfra deploy."""
    import subprocess
    import sys

    import vllm_fleet

    fresh = subprocess.run([sys.executable, "-c", "import sys, vllm_fleet; print('pyinfra' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "False"
    names = [n for n in vllm_fleet.__all__ if n != "__version__"]
    assert sorted(names) == sorted(vllm_fleet._DEPLOYS)
    for name in names:
        func = getattr(vllm_fleet, name)
        assert name.endswith("_vllm") or "_vllm_" in name, name
        doc = func.__doc__ or ""
        assert "**Example:**" in doc and f"from vllm_fleet import {name}" in doc.replace(
            "deploy_vllm, deploy_vllm_balancer", "deploy_vllm_balancer"), name
        assert "Host data" in doc and " read" in doc, name


def test_explain_answers_for_every_key_and_refuses_an_unknown_one(capsys):
    from vllm_fleet import cli
    from vllm_fleet.core import keydoc

    for key in keydoc.all_keys():
        assert keydoc.explain(key).startswith(f"vllm.{key}")
    assert "0.32.0" in keydoc.explain("version") and "driver >=" in keydoc.explain("version")
    explained = keydoc.explain("version")
    assert ("    cu130: proven on vllm-fleet's lab: staged on Debian 13 from the PyPI mirror and the "
            "settings matrix checked by its own parser; not served (the lab has no GPU)") in explained
    assert "    cu130: not proven on vllm-fleet's lab: not installable from PyPI" in explained
    assert cli.main(["explain", "no_such_key"]) == 2
    assert "not an inventory key" in capsys.readouterr().err
