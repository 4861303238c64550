"""Hub models: resolved on the controller at plan time, fetched on the host before anything restarts.

The fetch is an operation of its own, after the release is built (its huggingface_hub does the work)
and before the config is validated (the validator reads the snapshot), so a node group's nodes all hold
the snapshot before the group barrier lets any of them restart, and a host that cannot fetch fails with
its old service still serving.
"""

from __future__ import annotations

import os
import shlex

from pyinfra import host
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.operations import python, server

from vllm_fleet.controller import hub as hub_api
from vllm_fleet.controller.run import current
from vllm_fleet.core import hub
from vllm_fleet.core.hostfacts import HubCacheFacts
from vllm_fleet.core.layout import HOST_TOOLS, VLLM_USER
from vllm_fleet.core.plan import HostPlan, InstancePlan
from vllm_fleet.core.spec import HostSpec, InstanceSpec, SpecError
from vllm_fleet.roles import remote
from vllm_fleet.roles.facts import HubCache
from vllm_fleet.roles.ops import Secret, marker_path, stale, synced_files


def resolved(spec: HostSpec, inst: InstanceSpec) -> hub.HubSnapshot:
    """The instance's repository at its revision, asked once per run whatever the host count; SpecError
    naming host and field when the hub does not have it or cannot be read."""
    m = inst.model
    assert m.hf_repo
    token = os.environ.get(inst.hf_token_env) if inst.hf_token_env else None
    key = (hub.endpoint_of(spec.hf_endpoint), m.hf_repo, m.revision or "main", inst.hf_token_env)
    cache = current().hub
    if key not in cache:
        try:
            cache[key] = hub_api.resolve(spec.hf_endpoint, m.hf_repo, m.revision, token)
        except hub_api.HubError as e:
            cache[key] = e
    found = cache[key]
    if isinstance(found, hub_api.HubError):
        raise SpecError([f"{host.name}: vllm.instances[{inst.name}].model.{found.field}: {found}"])
    return found


def on_host(snap: hub.HubSnapshot) -> HubCacheFacts:
    """The host's copy of the snapshot and the cache's free space (HubCache), read once per host."""
    seen = current().hub_caches
    key = (host.name, snap.directory)
    if key not in seen:
        seen[key] = host.get_fact(HubCache, snapshot=snap.directory, cache=hub.HUB_CACHE)
    return seen[key]


def disk_refusals(plan: HostPlan) -> list[str]:
    needs, free = [], {}
    for inst in plan.instances:
        if inst.hub is not None and inst.hub.resolved:
            found = on_host(inst.hub)
            fs_path = found.get("fs_path") or hub.HUB_CACHE
            needs.append((inst.name, inst.hub, fs_path, found["present"]))
            free[fs_path] = found["free"]
    return hub.disk_refusals(plan.host, needs, free)


def token(inst: InstancePlan, paths: tuple[str, ...]) -> None:
    """The fetch's token file, kept current for a hub model with hf_token_env, removed (with its marker)
    from any other instance that has one: a model source changed, or the token variable was dropped."""
    if inst.hub is not None and inst.hub_token_env:
        files = [(Secret(f"HF_TOKEN={os.environ[inst.hub_token_env]}\n"), inst.hub_token_path)]
        if stale(files, "root", "root", "600", paths):
            synced_files(name=f"hub token {inst.hub_token_path} (0600)", files=files, mode="600", paths=paths)
    elif current().manifests.get((host.name, paths), {}).get(inst.hub_token_path):
        path = inst.hub_token_path
        server.shell(name=f"remove {path} (no hub token wanted)",
                     commands=[f"rm -f {shlex.quote(path)} {shlex.quote(marker_path(path))}"])


def fetch(plan: HostPlan, inst: InstancePlan, paths: tuple[str, ...]) -> bool:
    """Fetch the instance's snapshot when the host lacks any of its files; True when it does."""
    token(inst, paths)
    snap = inst.hub
    if snap is None:
        return False
    lacking = hub.missing(snap, on_host(snap)["present"])
    if not lacking:
        return False
    python.call(name=f"fetch {snap.describe()} for {inst.name} ({len(lacking)} files, "
                     f"{hub.size(sum(f.size for f in lacking))}) from {snap.endpoint}",
                function=_fetch, command=fetch_command(plan, inst), label=snap.describe())
    return True


def fetch_command(plan: HostPlan, inst: InstancePlan) -> str:
    snap = inst.hub
    assert snap is not None
    cmd = [f"{plan.release_dir}/bin/python", f"{HOST_TOOLS}/hubfetch.py", "--repo", snap.repo, "--sha",
           snap.sha, "--endpoint", snap.endpoint, "--hf-home", hub.HF_HOME, "--user", VLLM_USER]
    if inst.hub_token_env:
        cmd += ["--token-file", inst.hub_token_path]
    for f in snap.files:  # exactly what the plan checked, not whatever else the repository holds
        cmd += ["--file", f.path]
    return shlex.join(cmd)


def _fetch(state: State, host: Host, command: str, label: str) -> bool:
    """Progress lines appear as they come; a failure fails the host, old service serving, with
    hubfetch's reason."""
    return remote.run_live(host, command, f"fetch of {label}", "nothing restarted", tail=3)
