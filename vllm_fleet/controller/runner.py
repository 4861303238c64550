"""pyinfra run in this process, through its Python API: what every `vllm-fleet` command is.

The steps are pyinfra's CLI's own (connect, collect every host in parallel, show the proposed
changes, execute, print the results, disconnect), so a command acts and prints as
`pyinfra INVENTORY vllm_fleet.roles.vllm.deploy_vllm` would, with the same inventory loader and
config.py. What a caller learns comes from pyinfra's State (which hosts connected, which failed) and
the run's own record on it (vllm_fleet/controller/run.py), never from printed text. A rollout loads the
inventory once and runs each wave as one such run over its hosts.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyinfra_cli  # noqa: F401  (gevent's monkey patching, before any socket, as pyinfra's CLI does)
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_inventory, ctx_state

from vllm_fleet.controller.run import DRY_ATTR, FleetRun


def _cli_mode() -> None:
    """As pyinfra's CLI sets itself up: operations are ordered by where the deploy calls them (not by
    count per host, the API's default, which would mismatch hosts whose operations differ), styled
    output, and pyinfra's log format on standard error."""
    import click
    import pyinfra
    from pyinfra.api.output import set_echo, set_formatter
    from pyinfra_cli.log import setup_logging

    if pyinfra.is_cli:
        return
    pyinfra.is_cli = True
    set_formatter(click.style)
    set_echo(click.echo)
    setup_logging(logging.INFO)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the inventory and config.py may import beside themselves


def load_inventory(path: str) -> Inventory:
    """The inventory as `pyinfra PATH ...` loads it (pyinfra's own loader), once per command."""
    from pyinfra_cli.inventory import make_inventory

    _cli_mode()
    with ctx_state.use(State()), ctx_config.use(Config()):
        try:
            return make_inventory(path, cwd=os.getcwd())
        except Exception as e:
            raise RuntimeError(f"cannot load inventory {path}: {load_error(path, e)}") from None


def load_error(path: str, error: BaseException) -> str:
    """What went wrong in an inventory file, at its line: pyinfra wraps what the file raised in an
    exception whose own text is a traceback of its own (click's message attribute is never set)."""
    import traceback

    inner = getattr(error, "exception", None) or error
    line = getattr(inner, "lineno", None) if isinstance(inner, SyntaxError) else None
    if line is None:
        tb = getattr(inner, "_traceback", None) or inner.__traceback__
        mine = Path(path).resolve()
        frames = [f for f in traceback.extract_tb(tb) if Path(f.filename).resolve() == mine]
        line = frames[-1].lineno if frames else None
    what = inner.msg if isinstance(inner, SyntaxError) else str(inner)
    return (f"line {line}: " if line else "") + f"{type(inner).__name__}: {what}"


def limit_hosts(inventory: Inventory, limit: str | None) -> list[str] | None:
    """--limit as pyinfra reads each of its values (a group's name, else a glob over host names), in
    inventory order; a value that matches no host is an error, before anything runs."""
    from fnmatch import fnmatch

    from pyinfra.api.exceptions import NoGroupError

    if not limit:
        return None
    wanted: set[str] = set()
    unknown = []
    for pattern in (p.strip() for p in limit.split(",") if p.strip()):
        try:
            found = {h.name for h in inventory.get_group(pattern)}
        except NoGroupError:
            found = {h.name for h in inventory if fnmatch(h.name, pattern)}
        unknown += [] if found else [pattern]
        wanted |= found
    if unknown:
        raise ValueError(f"--limit names hosts not in the inventory: {', '.join(unknown)} "
                         "(no host, group or glob matches)")
    return [h.name for h in inventory if h.name in wanted]


@dataclass
class Result:
    state: State
    error: str | None  # a pyinfra error that stopped the run (a refusal, no host left)
    output: str = ""  # what the run printed, when it was captured

    @property
    def fleet(self) -> FleetRun | None:
        """What the deploy recorded; None where it never ran (no host connected)."""
        return getattr(self.state, "_vllm_fleet_run", None)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.state.failed_hosts and not (self.fleet and self.fleet.failures)


def run(inventory: Inventory, deploy: Callable[[], Any], hosts: Iterable[str] | None = None,
        dry: bool = False, diff: bool = False, detect_changes: bool = False, capture: bool = False
        ) -> Result:
    """One pyinfra run of `deploy` (an @deploy function) over `hosts` (None: the whole inventory).
    detect_changes: show pyinfra's proposed changes first (what `pyinfra` without -y does, and what
    --diff needs); capture: keep the output for the caller instead of printing it."""
    from pyinfra_cli.prints import print_meta, print_results
    from pyinfra_cli.util import exec_file, load_func

    _cli_mode()
    config = Config()
    state = State(check_for_changes=detect_changes)
    state.cwd = os.getcwd()
    out = io.StringIO()
    with contextlib.ExitStack() as stack:
        if capture:
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(out))
        stack.enter_context(ctx_state.use(state))
        stack.enter_context(ctx_config.use(config))
        stack.enter_context(ctx_inventory.use(inventory))
        if Path("config.py").exists():
            exec_file("config.py")
        config.DIFF = diff
        config.lock_current_state()
        for h in inventory:  # a host's operation order is per run (a rollout runs several)
            h.op_hash_order = []
        limit = None
        if hosts is not None:
            limit = [inventory.get_host(name) for name in hosts]
        state.init(inventory, config, initial_limit=limit)
        setattr(state, DRY_ATTR, dry)  # a dry run holds no host lease (roles/lease.py)
        error = None
        try:
            state.set_stage(StateStage.Connect)
            connect_all(state)
            state.set_stage(StateStage.Prepare)
            load_func(state, deploy)
            if detect_changes:
                print_meta(state)
            if not dry:
                state.set_stage(StateStage.Execute)
                run_ops(state)
                state.set_stage(StateStage.Disconnect)
                print_results(state)
        except PyinfraError as e:
            error = str(e)
            print(f"--> pyinfra error: {e}", file=sys.stderr)
        finally:
            disconnect_all(state)
            # hosts the deploy reached outside the limit (a wave's load balancer) are connected on
            # demand and not disconnected by pyinfra; the next run in this process starts them anew
            for h in inventory:
                if h.connected:
                    h.disconnect()
            fleet = getattr(state, "_vllm_fleet_run", None)
            if fleet is not None:
                fleet.finish(state)  # where no host connected, no disconnect printed it
    return Result(state, error, out.getvalue())
