"""What an operator sees when one host cannot be reached: its own row in the plan, the others planned
all the same, a non-zero exit and no traceback (real SSH to the lab, and a port nothing listens on)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tests.hosts.conftest import INVENTORY, ROOT


def test_an_unreachable_host_is_its_own_row_and_the_others_are_planned(deployed, tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nothing answers there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "inv.py"
    inv.write_text(f"import runpy\nlab = runpy.run_path({INVENTORY!r})['lab']\n"
                   f"gone = [('gone-01', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, "
                   "'ssh_connect_retries': 0, 'vllm': {'model': {'name': 'm', 'path': '/nonexistent'}}})]\n")
    out = subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "plan", str(inv), "--limit",
                          "lab1,gone-01"], cwd=ROOT, env=os.environ, text=True,
                         capture_output=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "Traceback" not in text
    assert "gone-01: refused: gone-01: could not connect over SSH" in text, text[-3000:]
    assert re.search(r"^lab1 +cpu .*default: tiny-llama", text, re.M), text[-3000:]
    assert re.search(r"^gone-01 +- .*REFUSED$", text, re.M), text[-3000:]
