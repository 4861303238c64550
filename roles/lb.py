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
import shlex
from collections.abc import Generator
from urllib.parse import urlsplit

from pyinfra import host, inventory, logger, state
from pyinfra.api import FunctionCommand, deploy, operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FindFiles
from pyinfra.operations import apt, python, server, systemd

from vllm_fleet.controller.run import current
from vllm_fleet.core import lb as core
from vllm_fleet.core import render
from vllm_fleet.core.layout import HOST_TOOLS, SYSTEMD_DIR
from vllm_fleet.core.spec import SpecError
from vllm_fleet.roles import lease, remote
from vllm_fleet.roles.hostplan import Refused, inventory_specs
from vllm_fleet.roles.install import HOST_SRC
from vllm_fleet.roles.ops import Secret, stale, synced_files

LBCTL = f"{HOST_TOOLS}/lbctl.py"
SOCKET = "/run/vllm-fleet-lb.sock"
CONFIG = "/etc/haproxy/haproxy.cfg"
# a new config and door files are checked here, where haproxy does not read them, before they go live
STAGED_DIR = "/etc/haproxy/.vllm-fleet-staged"
STAGED = f"{STAGED_DIR}/check.cfg"
STAGED_LIVE = f"{STAGED_DIR}/haproxy.cfg"
ENV_FILE = "/etc/haproxy/vllm-fleet.env"
DROP_IN = f"{SYSTEMD_DIR}/haproxy.service.d/vllm-fleet.conf"
DOOR_DIR = "/etc/haproxy/vllm-fleet"


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
    if args[0] in ("show", "tenants"):
        return {"rows": [json.loads(line) for line in lines]}
    servers = list(args[1:] if args[0] == "ready" else args[2:])
    found = json.loads(lines[-1]) if lines else {"drained": [], "ready": [], "busy": {}, "unknown": servers}
    if found.get("unknown"):
        logger.warning(f"[{host.name}] load balancer {b.host} does not list {', '.join(found['unknown'])} "
                       "yet (deploys/lb.py adds it): no traffic goes there")
    return found


def drain(instance: str | None = None) -> None:
    """Drain this host's servers (or one instance's) everywhere and wait until their sessions end (or the
    bound passes: then the restart goes ahead and vLLM's own --shutdown-timeout finishes what is still
    in flight)."""
    for b, servers in fronting(host.name):
        names = [s.listener for s in servers if instance in (None, s.instance)]
        if not names:
            continue
        waited = _lbctl(b, "drain", str(b.spec.drain_timeout_s), *names)
        if waited["drained"]:
            logger.info(f"[{host.name}] drained in {b.host} after {waited['waited_s']} s"
                        + (f"; still busy after the bound: {waited['busy']}" if waited["busy"] else ""))


def ready(instance: str | None = None) -> None:
    """After a passing smoke test: back in rotation (also a host a failed change left drained)."""
    for b, servers in fronting(host.name):
        names = [s.listener for s in servers if instance in (None, s.instance)]
        if not names:
            continue
        done = _lbctl(b, "ready", *names)
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
        mine = {s.listener for s in servers}
        found += [f"{b.host}: {r['server']} {r['admin']}" for r in _lbctl(b, "show")["rows"]
                  if r["server"] in mine and r["admin"] in ("drain", "maint")]
    return found


def server_states() -> list[tuple[str, ...]]:
    """(door, model, server, status, admin state, check, sessions) of this host's instances, for
    `vllm-fleet status`."""
    rows: list[tuple[str, ...]] = []
    for b in balancers().values():
        mine = {s.listener: s for s in b.servers_of(host.name)}
        if not mine:
            continue
        for r in _lbctl(b, "show")["rows"]:
            if r["server"] in mine:
                rows.append((b.host, mine[r["server"]].model, r["server"], r["status"], r["admin"],
                             r["check"], str(r["sessions"])))
    return rows


def tenant_states() -> list[tuple[str, ...]]:
    """(door, tenant, requests over 60 s, requests, 4xx, tokens, tokens over 60 s) on this door host,
    for `vllm-fleet status`; the counts are the ones Prometheus reads (none without a metrics
    endpoint)."""
    b = balancers().get(host.name)
    if b is None or not b.spec.tenants:
        return []
    url = core.metrics_url(b.spec, core.TENANT_METRICS_PATH)
    rows = _lbctl(b, "tenants", core.TENANT_TABLE, *([url] if url else []))["rows"]
    rate = {r["tenant"]: r["rate_60s"] for r in rows if "tenant" in r}
    usage = core.tenant_usage(next((r["metrics"] for r in rows if "metrics" in r), ""))
    out = []
    for t in b.spec.tenants:
        u = usage.get(t.name)
        counts = [str(u[k]) if u else "-" for k in ("requests", "4xx", "tokens", "tokens_60s")]
        out.append((b.host, t.name, str(rate.get(t.name, 0)), *counts))
    return out


@deploy("vLLM front door")
def deploy_vllm_balancer() -> None:
    """The fleet's front door: haproxy from the distribution at the edge (routes by model, tenant keys,
    the API allowlist, limits), a vllm-router per model for cache-aware routing, and a listener per
    vLLM instance that a rollout drains. Validated (``haproxy -c``) before it goes live; a change of
    keys, tenants or models reloads haproxy and never restarts vLLM.

    Host data read: ``vllm_lb`` on the door's host (listen address, router, tenants, limits), ``vllm``
    of the hosts it fronts.
    Environment: the instances' key variables (the checks send them, and with tenants the door does),
    and each tenant's ``key_envs``.

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
    # the vLLM hosts' own lease: two operators' door deploys meeting here never mix their staged sets
    lease.take("door")
    lease.confirm_op()
    problems = [f"{host.name}: vllm_lb: {ctl} is not set (or empty) on the controller; the instances' "
                "checks need their key" for ctl, _ in b.key_vars if not os.environ.get(ctl)]
    problems += core.missing_tenant_keys(b, os.environ)
    if problems:
        raise LbError("\n".join(problems))
    debs = host.get_fact(DebPackages) or {}
    wanted = ["haproxy", *(["python3-venv"] if b.spec.router else [])]
    if any(p not in debs for p in wanted):
        apt.packages(name="haproxy (the distribution's)" + (", python3-venv" if b.spec.router else ""),
                     packages=wanted, update=True, cache_time=3600)
    if b.spec.router:
        _router_installed(b.spec.router)
    files = core.door_files(b, os.environ)
    if b.spec.tenants:
        files["door.lua"] = render.door_lua(b)
    door = [(text.encode(), f"{DOOR_DIR}/{name}") for name, text in files.items()]
    staged = [(text.encode(), f"{STAGED_DIR}/door/{name}") for name, text in files.items()]
    units = ({core.router_unit(m): render.router_unit(b, m).encode() for m in b.models}
             if b.spec.router else {})
    unit_files = [(text, f"{SYSTEMD_DIR}/{name}") for name, text in units.items()]
    cfg = render.haproxy_config(b, SOCKET, DOOR_DIR)
    env = [(Secret("".join(f"{var}={render.envquote(os.environ[ctl])}\n" for ctl, var in b.key_vars)),
            ENV_FILE)]
    drop_in = [(f"[Service]\nEnvironmentFile={ENV_FILE}\n".encode(), DROP_IN)]
    tools = [(str(HOST_SRC / "lbctl.py"), LBCTL)]
    paths = (CONFIG, ENV_FILE, DROP_IN, LBCTL, STAGED, STAGED_LIVE, *(d for _, d in door),
             *(d for _, d in staged), *(d for _, d in unit_files))
    if stale(tools, "root", "root", "755", paths):
        synced_files(name="lbctl.py", files=tools, mode="755", paths=paths)
    old_routers = [u for u in host.get_fact(FindFiles, path=SYSTEMD_DIR, quote_path=True, maxdepth=1,
                                           fname="vllm-fleet-router-*.service") or []
                   if u.rsplit("/", 1)[-1] not in units]
    door_changed = bool(stale(door, "root", "root", "600", paths))
    cfg_changed = bool(stale([(cfg.encode(), CONFIG)], "root", "root", "644", paths))
    if cfg_changed or door_changed:
        # the whole new set, config and files, is checked where haproxy does not read it; a refused
        # one leaves the live config and files as they were
        check = render.haproxy_config(b, SOCKET, f"{STAGED_DIR}/door")
        synced_files(name=f"staged {CONFIG} and door files (keys as SHA-256 only)",
                     files=[*staged, (check.encode(), STAGED), (cfg.encode(), STAGED_LIVE)], mode="600",
                     paths=paths)
        # haproxy's own check, with placeholder keys: the real ones never reach an argv
        placeholders = " ".join(f"{var}=placeholder" for _, var in b.key_vars)
        server.shell(name=f"haproxy validates the new {CONFIG} and door files, then they go live", commands=[
            f"{placeholders} haproxy -c -q -f {STAGED} && install -d -m 700 {DOOR_DIR} "
            f"&& cp -p {STAGED_DIR}/door/* {DOOR_DIR}/ && install -m 644 {STAGED_LIVE} {CONFIG} "
            f"&& rm -rf {STAGED_DIR}"])
    env_changed = bool(stale(env, "root", "root", "600", paths))
    if env_changed:
        synced_files(name=f"haproxy's instance keys {ENV_FILE} (0600)", files=env, mode="600", paths=paths)
    stale_units = stale(unit_files, "root", "root", "644", paths)
    unit_changed = bool(stale(drop_in, "root", "root", "644", paths))
    if unit_changed:
        synced_files(name=f"haproxy drop-in {DROP_IN}", files=drop_in, paths=paths)
    if stale_units:
        synced_files(name="router units", files=stale_units, paths=paths)
    if old_routers:
        server.shell(name="routers of models the door no longer serves stopped and removed", commands=[
            "systemctl disable --now " + " ".join(u.rsplit("/", 1)[-1] for u in old_routers),
            "rm -f " + " ".join(old_routers)])
    if unit_changed or stale_units or old_routers:
        server.shell(name="systemd daemon-reload", commands=["systemctl daemon-reload"])
    changed_units = {d.rsplit("/", 1)[-1] for _, d in stale_units}
    for name in units:
        systemd.service(name=f"router {name} running", service=name, running=True, enabled=True,
                        restarted=name in changed_units)
    # the environment is read when haproxy starts: a new key needs a restart, a new config or map a
    # reload (haproxy's reload keeps the connections it has)
    restart = env_changed or unit_changed
    systemd.service(name="haproxy running", service="haproxy", running=True, enabled=True,
                    restarted=restart, reloaded=(cfg_changed or door_changed) and not restart)


def _router_installed(r: core.RouterSpec) -> None:
    """vllm-router in its own versioned venv, from the door's index; a half-made venv (no marker) is
    made again."""
    where = core.router_dir(r.version)
    if host.get_fact(File, path=f"{where}/.complete"):
        return
    index = shlex.quote(r.index_url)
    trusted = (f" --trusted-host {shlex.quote(urlsplit(r.index_url).hostname or '')}"
               if r.index_url.startswith("http://") else "")
    server.shell(name=f"{core.ROUTER_PACKAGE} {r.version} into {where}", commands=[
        f"rm -rf {where} && python3 -m venv {where} && {where}/bin/pip install -q "
        f"--disable-pip-version-check --timeout 600 --index-url {index}{trusted} "
        f"{core.ROUTER_PACKAGE}=={r.version} "
        f"&& {where}/bin/vllm-router --help > /dev/null && touch {where}/.complete"])
