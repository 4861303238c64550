"""`vllm-fleet logs`: the journal's last lines of each instance, one remote command per host. Pure.

The instances come from the inventory, not from a plan, so the logs of a host whose plan is refused (a
model gone, a broken flag) can still be read: that is when they are wanted most.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

from vllm_fleet.core.layout import unit_name

INSTANCE_ENV = "VLLM_FLEET_LOGS_INSTANCE"
LINES_ENV = "VLLM_FLEET_LOGS_LINES"
DEFAULT_LINES = 50
# starts each instance's section of the command's output; no journal line (short-iso) starts so
_MARK = "## vllm-fleet journal "


def watchdog_unit(instance: str) -> str:
    return f"vllm-watchdog@{instance}.service"


def journal_command(instances: Sequence[str], lines: int) -> str:
    """One command for every instance of the host: the unit and its watchdog merged by journalctl (a
    unit that does not exist adds nothing); errors (a journal not readable) are shown, not hidden."""
    parts = [f"echo {shlex.quote(_MARK + name)}; journalctl -u {shlex.quote(unit_name(name))} "
             f"-u {shlex.quote(watchdog_unit(name))} -n {int(lines)} --no-pager -o short-iso 2>&1"
             for name in instances]
    return "; ".join([*parts, "true"])


def split_output(lines: Iterable[str]) -> dict[str, list[str]]:
    """Instance name -> its journal lines, from `journal_command`'s output."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(_MARK):
            current = out.setdefault(line[len(_MARK):].strip(), [])
        elif current is not None:
            current.append(line)
    return out


def header(host: str, instance: str) -> str:
    return f"== {host} / {instance} ({unit_name(instance)}) =="


def render(journals: Mapping[str, Mapping[str, Sequence[str]]]) -> str:
    """Every host's journals, hosts sorted, each instance in inventory order under its header."""
    blocks = []
    for host in sorted(journals):
        for instance, lines in journals[host].items():
            blocks.append("\n".join([header(host, instance), *lines]))
    return "\n\n".join(blocks)


def select(instances_by_host: Mapping[str, Sequence[str]], wanted: str | None) -> dict[str, list[str]]:
    """Host -> the instances to show; hosts without `wanted` drop out. An instance on none of the hosts
    is a ValueError naming each host and the instances it has, so a typo is not an empty output."""
    if wanted is None:
        return {h: list(names) for h, names in instances_by_host.items()}
    chosen = {h: [wanted] for h, names in instances_by_host.items() if wanted in names}
    if instances_by_host and not chosen:
        have = "; ".join(f"{h}: {', '.join(names)}" for h, names in sorted(instances_by_host.items()))
        raise ValueError(f"no instance {wanted!r} on {', '.join(sorted(instances_by_host))} (instances: "
                         f"{have})")
    return chosen


def absent(instances_by_host: Mapping[str, Sequence[str]], wanted: str) -> list[str]:
    """A note for each host that `select` dropped, so a host missing from the output is explained."""
    return [f"{h}: no instance {wanted!r} (instances: {', '.join(names)})"
            for h, names in sorted(instances_by_host.items()) if wanted not in names]


def parse_lines(value: str | None) -> int:
    """The --lines value as the deploy reads it back from the environment."""
    if value in (None, ""):
        return DEFAULT_LINES
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{LINES_ENV}: {value!r} is not a positive number of lines")
    return n
