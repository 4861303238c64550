"""`vllm-fleet targets` (the Prometheus file_sd file) and `vllm-fleet dashboards` (Grafana dashboard and
Prometheus rules), from each selected host's plan. Read-only.

Each host is planned as the deploy plans it (facts, no secrets), since the release label depends on its
facts. The file is written by one operation on the first vLLM host collected: pyinfra collects every
host before it executes any operation, so by then every plan is known, and a failed write fails that
operation and the run (an exit hook, as `plan` prints with, cannot change the exit status). A host that
could not be reached or planned leaves the previous file as it was: a file without its targets would
hide that host from Prometheus just when it should be reported down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.operations import python

from vllm_fleet.controller.run import current
from vllm_fleet.core import observe, prometheus
from vllm_fleet.core.flags import version_tuple
from vllm_fleet.core.plan import HostPlan
from vllm_fleet.roles.facts import VllmHost
from vllm_fleet.roles.hostplan import inventory_specs, plan_without_secrets, this_host
from vllm_fleet.roles.lb import balancers


def output_path() -> str:
    return os.environ.get(prometheus.OUTPUT_ENV) or prometheus.DEFAULT_OUTPUT


@deploy("vLLM Prometheus targets")
def write_vllm_targets() -> None:
    """Prometheus file_sd targets for every instance a scraper can reach, and the front doors' metrics
    endpoints, written on the controller, atomically, once per run. Changes nothing on the hosts.

    Host data read: ``vllm``, ``vllm_defaults``. Environment: ``VLLM_FLEET_TARGETS_OUTPUT`` (the file).

    **Example:**

    .. code:: python

        from vllm_fleet import write_vllm_targets

        write_vllm_targets()
    """
    if inventory_specs(check_secrets=False).get(host.name) is None:
        return  # not a vLLM host: nothing to scrape
    run = current()
    plans: dict[str, tuple[HostPlan, str]] = run.rows.setdefault("targets", {})
    summary = run.rows.setdefault("targets summary", [])
    # checked and set before any fact I/O (hosts are collected concurrently): one writer, the first host
    if run.at_end("targets", lambda: print("\n" + summary[0]) if summary else None):
        python.call(name="write Prometheus targets", function=_write, path=output_path(), plans=plans,
                    summary=summary)
    spec = this_host(check_secrets=False)
    assert spec is not None
    plan = plan_without_secrets(spec)
    # the release label says what the host runs now (after a rollback, not what the inventory asks for);
    # a host with nothing deployed yet is labelled with the release it will get
    running = host.get_fact(VllmHost)["current"]
    plans[host.name] = (dataclasses.replace(plan, release=running or plan.release),
                         host.data.get("ssh_hostname") or host.name)


def write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory, then rename: a Prometheus watching the file reads the old one or
    the new one, never half of one. 0644: Prometheus runs as its own user."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(state: State, host: Host, path: str, plans: dict[str, tuple[HostPlan, str]],
           summary: list[str]) -> bool:
    """pyinfra passes (state, host) to a callback that takes them; False fails the host, no traceback."""
    missing = _unplanned(state, plans)
    if missing:
        return _fail(host, summary, f"{path} not written (left as it was): no plan for {', '.join(missing)} "
                                    "(unreachable or failed, see above)")
    groups, left_out = prometheus.file_sd(plans.values())
    doors = [(b, inventory.get_host(name).data.get("ssh_hostname") or name)
             for name, b in balancers().items() if state.is_host_in_limit(inventory.get_host(name))]
    door_groups, door_left_out = prometheus.door_targets(doors)
    groups, left_out = groups + door_groups, left_out + door_left_out
    try:
        write_atomically(Path(path), prometheus.render(groups))
    except OSError as e:
        return _fail(host, summary, f"{path} not written: {e}")
    summary.append(prometheus.summary(groups, left_out, path))
    return True


def _unplanned(state: State, planned: dict) -> list[str]:
    """The selected vLLM hosts without a plan in this run (unreachable, or failed while collecting)."""
    expected = {h.name for h in inventory if state.is_host_in_limit(h)
                and h.name in inventory_specs(check_secrets=False)}
    return sorted((expected - set(planned)) | {h.name for h in state.failed_hosts})


def _fail(host: Host, summary: list[str], message: str, what: str = "targets") -> bool:
    host.log_styled(f"{what}: {message}", fg="red", log_func=logger.error)
    summary.append(f"{what}: {message}")
    return False


DASHBOARDS_ENV = "VLLM_FLEET_DASHBOARDS"  # JSON: output directory and the Fleet's settings


@deploy("vLLM dashboards and rules")
def write_vllm_dashboards() -> None:
    """The Grafana dashboard and the Prometheus recording and alert rules for the selected hosts, written
    on the controller, atomically, once per run. Their metric names are those of every release the
    hosts run or are to run (both, mid-rollout); changes nothing on the hosts.

    Host data read: ``vllm``, ``vllm_defaults``, ``vllm_lb``. Environment: ``VLLM_FLEET_DASHBOARDS``
    (JSON: ``output`` directory, ``job``, ``ttft_p99_target_s``, ``down_for``).

    **Example:**

    .. code:: python

        from vllm_fleet import write_vllm_dashboards

        write_vllm_dashboards()
    """
    if inventory_specs(check_secrets=False).get(host.name) is None:
        return
    run = current()
    seen: dict[str, tuple[set[str], set[str], int]] = run.rows.setdefault("dashboards", {})
    summary = run.rows.setdefault("dashboards summary", [])
    if run.at_end("dashboards", lambda: print("\n" + summary[0]) if summary else None):
        python.call(name="write dashboards and rules", function=_write_dashboards, seen=seen, summary=summary)
    spec = this_host(check_secrets=False)
    assert spec is not None
    plan = plan_without_secrets(spec)
    running = host.get_fact(VllmHost)["current"]
    releases = {r.split("-", 1)[0] for r in (running, plan.release) if r}
    seen[host.name] = (releases, {i.served_name for i in plan.instances}, plan.ready_timeout_s)


def _write_dashboards(state: State, host: Host, seen: dict[str, tuple[set[str], set[str], int]],
                      summary: list[str]) -> bool:
    missing = _unplanned(state, seen)
    if missing:
        return _fail(host, summary, f"dashboards not written: no plan for {', '.join(missing)} "
                                    "(unreachable or failed, see above)", "dashboards")
    settings = json.loads(os.environ.get(DASHBOARDS_ENV) or "{}")
    out = Path(settings.pop("output", "."))
    releases = sorted(set().union(*(r for r, _, _ in seen.values())), key=version_tuple)
    models = sorted(set().union(*(m for _, m, _ in seen.values())))
    if not settings.get("down_for"):
        # a restart (a deploy's, the watchdog's) takes up to the host's ready timeout: not an outage
        settings["down_for"] = f"{max(t for _, _, t in seen.values()) + 60}s"
    doors = sorted(name for name in balancers() if state.is_host_in_limit(inventory.get_host(name)))
    try:
        fleet = observe.Fleet(releases=tuple(releases), models=tuple(models), doors=tuple(doors), **settings)
        files = {observe.DASHBOARD_FILE: observe.dashboard_json(fleet),
                 observe.RULES_FILE: observe.rules_yaml(fleet)}
    except observe.ObserveError as e:
        return _fail(host, summary, str(e), "dashboards")
    try:
        for name, text in files.items():
            write_atomically(out / name, text)
    except OSError as e:
        return _fail(host, summary, f"not written: {e}", "dashboards")
    summary.append(observe.summary(fleet, [str(out / n) for n in files]))
    return True
