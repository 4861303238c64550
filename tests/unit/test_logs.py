"""vllm_fleet/core/logs.py: the journal command, splitting its output per instance, the --instance choice. The
command is also run by a real shell against a stand-in journalctl that prints its argv."""

from __future__ import annotations

import os
import subprocess

import pytest

from vllm_fleet.core.logs import (
    DEFAULT_LINES,
    absent,
    header,
    journal_command,
    parse_lines,
    render,
    select,
    split_output,
    watchdog_unit,
)
from vllm_fleet.roles.logs import Journal


def test_each_instance_reads_its_unit_and_its_watchdog_merged() -> None:
    cmd = journal_command(["default", "second"], 50)
    for name in ("default", "second"):
        assert (f"journalctl -u vllm-{name}.service -u vllm-watchdog@{name}.service -n 50 --no-pager "
                f"-o short-iso 2>&1") in cmd
    assert cmd.endswith("; true")  # a missing journal is shown, not a failed fact
    assert watchdog_unit("default") == "vllm-watchdog@default.service"


def test_the_command_runs_in_a_shell_and_splits_back_per_instance(tmp_path) -> None:
    fake = tmp_path / "journalctl"
    fake.write_text('#!/bin/sh\necho "2025-12-03T09:12:01+0000 lab1 vllm[377]: args: $*"\n'
                    'echo "2025-12-03T09:12:02+0000 lab1 vllm[377]: second line"\n')
    fake.chmod(0o755)
    out = subprocess.run(["sh", "-c", journal_command(["default", "b-2"], 7)], capture_output=True,
                         text=True, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.returncode == 0
    journals = split_output(out.stdout.splitlines())
    assert list(journals) == ["default", "b-2"]
    assert journals["b-2"] == [
        "2025-12-03T09:12:01+0000 lab1 vllm[377]: args: -u vllm-b-2.service -u vllm-watchdog@b-2.service "
        "-n 7 --no-pager -o short-iso",
        "2025-12-03T09:12:02+0000 lab1 vllm[377]: second line"]


def test_split_keeps_journalctls_own_notes_and_an_empty_section() -> None:
    output = ["## vllm-fleet journal default", "-- No entries --", "## vllm-fleet journal second"]
    assert split_output(output) == {"default": ["-- No entries --"], "second": []}
    assert Journal().process(output) == split_output(output)


def test_render_prints_a_header_per_host_and_instance_hosts_sorted() -> None:
    text = render({"lab2": {"default": ["l2"]},
                   "lab1": {"default": ["a", "b"], "second": []}})
    assert text == ("== lab1 / default (vllm-default.service) ==\na\nb\n\n"
                    "== lab1 / second (vllm-second.service) ==\n\n"
                    "== lab2 / default (vllm-default.service) ==\nl2")
    assert header("gpu-07", "chat") == "== gpu-07 / chat (vllm-chat.service) =="
    assert render({}) == ""


def test_instance_selection() -> None:
    hosts = {"lab1": ["default", "second"], "lab2": ["default"]}
    assert select(hosts, None) == hosts
    assert select(hosts, "second") == {"lab1": ["second"]}
    assert absent(hosts, "second") == ["lab2: no instance 'second' (instances: default)"]
    with pytest.raises(ValueError) as e:
        select(hosts, "secnd")
    assert str(e.value) == ("no instance 'secnd' on lab1, lab2 (instances: lab1: default, second; "
                            "lab2: default)")
    assert select({}, "x") == {}  # no vLLM host selected: nothing to show, not an error


def test_lines() -> None:
    assert parse_lines(None) == parse_lines("") == DEFAULT_LINES == 50
    assert parse_lines("200") == 200
    for bad in ("0", "-3", "ten"):
        with pytest.raises(ValueError, match="VLLM_FLEET_LOGS_LINES"):
            parse_lines(bad)
