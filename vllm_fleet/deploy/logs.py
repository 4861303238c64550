"""`vllm-fleet logs`: each selected vLLM instance's last journal lines, read-only, printed once after
every host (pyinfra collects hosts concurrently; lines printed as they came would interleave)."""

from __future__ import annotations

import atexit
import os

from pyinfra import host, inventory, state
from pyinfra.api import FactBase, deploy

from vllm_fleet.core import logs
from vllm_fleet.core.spec import skipped_note
from vllm_fleet.deploy.vllm import _SKIPPED, Refused, inventory_specs, this_host

_JOURNALS: dict[str, dict[str, list[str]]] = {}
_NOTES: list[str] = []
_AT_EXIT: list[str] = []


class Journal(FactBase):
    """
    Returns each instance's last journal lines, its unit's and its watchdog's merged by time:

    .. code:: python

        {"default": ["2025-12-03T09:12:01+0000 lab1 vllm[377]: INFO ... Starting vLLM server on ...", ...]}
    """

    def command(self, instances: tuple[str, ...], lines: int) -> str:
        return logs.journal_command(instances, lines)

    def process(self, output):
        return logs.split_output(output)


def _print() -> None:
    notes = [*_NOTES, *([skipped_note(_SKIPPED)] if _SKIPPED else [])]
    blocks = [b for b in (logs.render(_JOURNALS), "\n".join(notes)) if b]
    if blocks:
        print("\n" + "\n\n".join(blocks))


@deploy("vLLM logs")
def show_logs() -> None:
    specs = inventory_specs(check_secrets=False)
    wanted = os.environ.get(logs.INSTANCE_ENV) or None
    selected = {h.name: [i.name for i in specs[h.name].instances] for h in inventory
                if state.is_host_in_limit(h) and h.name in specs}
    try:  # before any I/O: a typo in --instance or --lines is refused on the controller
        lines = logs.parse_lines(os.environ.get(logs.LINES_ENV))
        chosen = logs.select(selected, wanted)
    except ValueError as e:
        raise Refused(f"logs: {e}") from None
    if not _AT_EXIT:  # checked and set before any fact I/O
        _AT_EXIT.append("logs")
        _NOTES.extend(logs.absent(selected, wanted) if wanted else [])
        atexit.register(_print)
    if host.name not in chosen:
        return  # not a vLLM host (noted by inventory_specs), or without the wanted instance (noted above)
    this_host(check_secrets=False)  # the login is checked before anything runs as root
    _JOURNALS[host.name] = host.get_fact(Journal, instances=tuple(chosen[host.name]), lines=lines) or {}
