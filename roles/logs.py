"""`vllm-fleet logs`: each selected vLLM instance's last journal lines, read-only, printed once after
every host (pyinfra collects hosts concurrently; lines printed as they came would interleave)."""

from __future__ import annotations

import os

from pyinfra import host, inventory, state
from pyinfra.api import FactBase, deploy

from vllm_fleet.controller.run import current
from vllm_fleet.core import logs
from vllm_fleet.core.spec import skipped_note
from vllm_fleet.roles.hostplan import Refused, inventory_specs, this_host


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


def _print(journals: dict[str, dict[str, list[str]]], notes: list[str], skipped: list[str]) -> None:
    notes = [*notes, *([skipped_note(skipped)] if skipped else [])]
    blocks = [b for b in (logs.render(journals), "\n".join(notes)) if b]
    if blocks:
        print("\n" + "\n\n".join(blocks))


@deploy("vLLM logs")
def tail_vllm_logs() -> None:
    """The journal's last lines of each vLLM instance, changing nothing: ``vllm-fleet logs``.

    Host data read: ``vllm``, ``vllm_defaults``. Environment: ``VLLM_FLEET_LOGS_INSTANCE`` (one
    instance), ``VLLM_FLEET_LOGS_LINES`` (lines per instance).

    **Example:**

    .. code:: python

        from vllm_fleet import tail_vllm_logs

        tail_vllm_logs()
    """
    run = current()
    if "logs selection" not in run.rows:  # the whole inventory's selection, once per run
        specs = inventory_specs(check_secrets=False)
        wanted = os.environ.get(logs.INSTANCE_ENV) or None
        selected = {h.name: [i.name for i in specs[h.name].instances] for h in inventory
                    if state.is_host_in_limit(h) and h.name in specs}
        try:  # before any I/O: a typo in --instance or --lines is refused on the controller, every host
            lines = logs.parse_lines(os.environ.get(logs.LINES_ENV))
            chosen = logs.select(selected, wanted)
        except ValueError as e:
            raise Refused(f"logs: {e}") from None
        notes = logs.absent(selected, wanted) if wanted else []
        journals: dict[str, dict[str, list[str]]] = run.rows.setdefault("logs", {})
        run.at_end("logs", lambda: _print(journals, notes, run.skipped))  # before any fact I/O
        run.rows["logs selection"] = (lines, chosen)
    lines, chosen = run.rows["logs selection"]
    journals = run.rows["logs"]
    if host.name not in chosen:
        return  # not a vLLM host (noted by inventory_specs), or without the wanted instance (noted above)
    this_host(check_secrets=False)  # the login is checked before anything runs as root
    journals[host.name] = host.get_fact(Journal, instances=tuple(chosen[host.name]), lines=lines) or {}
