"""A pyinfra deploy with no operations: plan each host exactly as deploys/vllm.py does (same inventory,
group data and facts) and write what that deploy would put on it into $VLLM_FLEET_RENDER_DIR/<host>/,
for the Ansible play to assert. The env file is written as a template: the key stays out of the files.
"""

import os
from pathlib import Path

import yaml
from pyinfra import host

from vllm_fleet.controller import wheels
from vllm_fleet.core import render
from vllm_fleet.core.layout import BASE_DIRS, CURRENT_LINK, STAGED, STATE_DIR
from vllm_fleet.roles.hostplan import plan_this_host
from vllm_fleet.roles.install import HOST_SCRIPTS, HOST_SRC, HOST_TOOLS

out = Path(os.environ["VLLM_FLEET_RENDER_DIR"]) / host.name
files = out / "files"
files.mkdir(parents=True, exist_ok=True)
plan, _ = plan_this_host()
if len(plan.instances) != 1:
    raise SystemExit(f"{host.name}: the Ansible comparison covers one instance per host")
inst = plan.instances[0]
(files / f"{inst.name}.yaml").write_text(render.serve_config(plan, inst))
(files / inst.unit).write_text(render.unit(plan, inst))
(files / f"{inst.name}.environment").write_text(render.environment_file(inst))
# our own template, each secret replaced by a lookup Ansible fills from the controller's environment
(files / f"{inst.name}.env.j2").write_text(render.env_file(
    inst, {ctl: f"{{{{ lookup('ansible.builtin.env', '{ctl}') }}}}" for ctl in inst.secret_env.values()}))
tools = [{"src": "uv", "dest": "/usr/local/bin/uv"}]
(files / "uv").write_bytes(wheels.uv_binary().read_bytes())
for tool in HOST_SCRIPTS:
    (files / tool).write_bytes((HOST_SRC / tool).read_bytes())
    tools.append({"src": tool, "dest": f"{HOST_TOOLS}/{tool}"})
dirs = []
for path, own in BASE_DIRS.items():
    user, group, mode = own.split(":")
    dirs.append({"path": path, "owner": user, "group": group, "mode": "0" + mode})
(out / "vars.yml").write_text(yaml.safe_dump({
    "rendered": str(out), "instance": inst.name, "unit": inst.unit, "served_name": inst.served_name,
    "state_dir": STATE_DIR, "base_dirs": dirs, "tools": tools, "release": plan.release,
    "release_dir": plan.release_dir, "current_link": CURRENT_LINK, "model_src": inst.stage_from,
    "model_dir": inst.model_dir, "config_path": inst.config_path, "env_path": inst.env_path,
    "environment_path": inst.environment_path,
    "staged_path": f"{STAGED}/{inst.name}.yaml", "ready_timeout_s": plan.ready_timeout_s,
    "base_url": f"http://127.0.0.1:{inst.port}",
}, sort_keys=False))
