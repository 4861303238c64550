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
