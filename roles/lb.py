"""haproxy in front of the fleet (deploys/lb.py), and the drain around each vLLM restart.

The vLLM deploy drains a host's servers in every load balancer that fronts it before it restarts the
host, waits (bounded) until their sessions end, restarts, smoke-tests, and only then makes them ready
again. A host whose change fails stays drained while it is rolled back: an operator looks before
clients do. The drain runs from the vLLM host's own operations, reaching the load balancer through its
inventory login, so a rollout's `--limit` wave, a plain deploy and a rollback all drain the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator

from pyinfra import host, inventory, logger, state
from pyinfra.api import FunctionCommand, deploy, operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, python, server, systemd

from vllm_fleet.controller.run import current
from vllm_fleet.core import lb as core
from vllm_fleet.core import render
from vllm_fleet.core.layout import HOST_TOOLS
from vllm_fleet.core.spec import SpecError
from vllm_fleet.roles import remote
from vllm_fleet.roles.hostplan import Refused, inventory_specs
from vllm_fleet.roles.install import HOST_SRC
from vllm_fleet.roles.ops import Secret, stale, synced_files

LBCTL = f"{HOST_TOOLS}/lbctl.py"
SOCKET = "/run/vllm-fleet-lb.sock"
CONFIG = "/etc/haproxy/haproxy.cfg"
STAGED = "/etc/haproxy/.vllm-fleet-staged.cfg"
ENV_FILE = "/etc/haproxy/vllm-fleet.env"
DROP_IN = "/etc/systemd/system/haproxy.service.d/vllm-fleet.conf"


class LbError(PyinfraError):
    pass


def balancers() -> dict[str, core.Balancer]:
    """Every load balancer of the inventory and the servers it fronts, validated once per run."""
    run = current()
    if run.balancers is None:
        run.balancers = _balancers()
    return run.balancers


def _balancers() -> dict[str, core.Balancer]:
    lbs = {h.name: h.data.get("vllm_lb") for h in inventory if h.data.get("vllm_lb") is not None}
    if not lbs:
        return {}
    specs = inventory_specs(check_secrets=False)
    try:
        return core.balancers(lbs, specs, {h.name: h.data.get("ssh_hostname") or h.name for h in inventory})
    except SpecError as e:
        raise Refused("inventory refused, nothing was changed:\n  " + "\n  ".join(e.problems)) from None


def fronting(name: str) -> list[tuple[core.Balancer, list[core.Server]]]:
    """(balancer, this host's servers in it) for each load balancer that drains around its restarts."""
    return [(b, s) for b in balancers().values() if b.spec.drain and (s := b.servers_of(name))]


def balancer_host(b: core.Balancer):
    lb_host = inventory.get_host(b.host)
    if not lb_host.connected:
        lb_host.connect(reason="to drain its servers", raise_exceptions=True)
    return lb_host


def _lbctl(b: core.Balancer, *args: str) -> dict:
    """lbctl on the balancer; a balancer not deployed yet (no lbctl, or servers it does not list) sends
    these servers no traffic, which is said, not refused: deploys/lb.py adds them."""
    lb_host = balancer_host(b)
    problem = remote.login_problem_of(lb_host)
    if problem:
        raise LbError(problem)
    ok, out = remote.run(f"test -x {LBCTL} || exit 0; " + " ".join(["python3", LBCTL, SOCKET, *args]),
                         on=lb_host)
    if not ok and not out.stdout.strip():
        raise LbError(f"{host.name}: load balancer {b.host}: lbctl {args[0]} failed: "
                      f"{out.output.strip()[-400:] or 'no output'}")
    lines = out.stdout.strip().splitlines()
    if args[0] == "show":
        return {"rows": [json.loads(line) for line in lines]}
    servers = list(args[1:] if args[0] == "ready" else args[2:])
    found = json.loads(lines[-1]) if lines else {"drained": [], "ready": [], "busy": {}, "unknown": servers}
    if found.get("unknown"):
        logger.warning(f"[{host.name}] load balancer {b.host} does not list {', '.join(found['unknown'])} "
                       "yet (deploys/lb.py adds it): no traffic goes there")
    return found


def drain() -> None:
    """Drain this host's servers everywhere and wait until their sessions end (or the bound passes:
    then the restart goes ahead and vLLM's own --shutdown-timeout finishes what is still in flight)."""
    for b, servers in fronting(host.name):
        names = [f"{core.BACKEND}/{s.name}" for s in servers]
        waited = _lbctl(b, "drain", str(b.spec.drain_timeout_s), *names)
        if waited["drained"]:
            logger.info(f"[{host.name}] drained in {b.host} after {waited['waited_s']} s"
                        + (f"; still busy after the bound: {waited['busy']}" if waited["busy"] else ""))


def ready() -> None:
    """After a passing smoke test: back in rotation (also a host a failed change left drained)."""
    for b, servers in fronting(host.name):
        done = _lbctl(b, "ready", *[f"{core.BACKEND}/{s.name}" for s in servers])
        if done["ready"]:
            logger.info(f"[{host.name}] ready in {b.host}")


def drain_op() -> None:
    if fronting(host.name):
        python.call(name="drain in load balancer " + ", ".join(b.host for b, _ in fronting(host.name)),
                    function=drain)


def ready_op(drains: bool) -> None:
    """drains: this run drains the host (it restarts something), so making it ready is part of the
    change; otherwise the operation reads the balancers and changes something only where a server of
    this host is still drained (a failed change left it so), and reports no change on a converged host."""
    if fronting(host.name):
        readied(name="ready in load balancer " + ", ".join(b.host for b, _ in fronting(host.name)),
                drains=drains)


@operation(is_idempotent=True, _set_in_op=False)
def readied(drains: bool) -> Generator[FunctionCommand, None, None]:
    if drains or (state.is_executing and not_ready()):
        yield FunctionCommand(ready, (), {})


def not_ready() -> list[str]:
    """This host's servers whose admin state is not ready, in any balancer that drains it."""
    found = []
    for b, servers in fronting(host.name):
        mine = {f"{core.BACKEND}/{s.name}" for s in servers}
        found += [f"{b.host}: {r['server']} {r['admin']}" for r in _lbctl(b, "show")["rows"]
                  if r["server"] in mine and r["admin"] in ("drain", "maint")]
    return found


def server_states() -> list[tuple[str, ...]]:
    """(load balancer, server, status, admin state, check, sessions) of this host's servers, for
    `vllm-fleet status`."""
    rows: list[tuple[str, ...]] = []
    for b in balancers().values():
        mine = {f"{core.BACKEND}/{s.name}" for s in b.servers_of(host.name)}
        if not mine:
            continue
        for r in _lbctl(b, "show")["rows"]:
            if r["server"] in mine:
                rows.append((b.host, r["server"], r["status"], r["admin"], r["check"], str(r["sessions"])))
    return rows


@deploy("vLLM load balancer")
def deploy_vllm_balancer() -> None:
    """haproxy from the distribution in front of the fleet's instances, configured from the inventory and
    validated (``haproxy -c``) before it goes live. The vLLM deploy drains a host here around its restart.

    Host data read: ``vllm_lb`` on the balancer's host (its listen address, the servers' model, the key
    variable), ``vllm`` of the hosts it fronts.
    Environment: the variable ``vllm_lb`` names for the instances' key (the health check sends it).

    **Example:**

    .. code:: python

        from vllm_fleet import deploy_vllm, deploy_vllm_balancer

        deploy_vllm()
        deploy_vllm_balancer()
    """
    b = balancers().get(host.name)
    if b is None:
        return
    remote.check_login()
    if "haproxy" not in (host.get_fact(DebPackages) or {}):
        apt.packages(name="haproxy (the distribution's)", packages=["haproxy"], update=True, cache_time=3600)
    key = os.environ.get(b.api_key_env, "") if b.api_key_env else ""
    if b.api_key_env and not key:
        raise LbError(f"{host.name}: vllm_lb: {b.api_key_env} is not set (or empty) on the controller; "
                      "the health check needs the instances' key")
    cfg = render.haproxy_config(b, SOCKET)
    env = [(Secret(f"{core.KEY_VAR}={render.envquote(key)}\n" if key else ""), ENV_FILE)]
    drop_in = [(f"[Service]\nEnvironmentFile={ENV_FILE}\n".encode(), DROP_IN)]
    tools = [(str(HOST_SRC / "lbctl.py"), LBCTL)]
    paths = (CONFIG, ENV_FILE, DROP_IN, LBCTL, STAGED)
    if stale(tools, "root", "root", "755", paths):
        synced_files(name="lbctl.py", files=tools, mode="755", paths=paths)
    cfg_changed = bool(stale([(cfg.encode(), CONFIG)], "root", "root", "644", paths))
    if cfg_changed:
        synced_files(name=f"staged {CONFIG}", files=[(cfg.encode(), STAGED)], mode="600", paths=paths)
        # haproxy's own check, with a placeholder key: the real one never reaches an argv
        server.shell(name=f"haproxy validates the new {CONFIG}", commands=[
            f"{core.KEY_VAR}=placeholder haproxy -c -q -f {STAGED} && install -m 644 {STAGED} {CONFIG} "
            f"&& rm -f {STAGED}"])
    env_changed = bool(stale(env, "root", "root", "600", paths))
    if env_changed:
        synced_files(name=f"haproxy key {ENV_FILE} (0600)", files=env, mode="600", paths=paths)
    unit_changed = bool(stale(drop_in, "root", "root", "644", paths))
    if unit_changed:
        synced_files(name=f"haproxy drop-in {DROP_IN}", files=drop_in, paths=paths)
        server.shell(name="systemd daemon-reload", commands=["systemctl daemon-reload"])
    # the environment is read when haproxy starts: a new key needs a restart, a new config a reload
    restart = env_changed or unit_changed
    systemd.service(name="haproxy running", service="haproxy", running=True, enabled=True,
                    restarted=restart, reloaded=cfg_changed and not restart)
