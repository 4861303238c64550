"""Four servers with 8 GPUs each, every one serving the fleet's model on all eight GPUs.

Plain data, read by pyinfra: each group is a list of (name, data). group_data/all.py beside this
file adds the fleet-wide choices to every host.
"""

# How each host is reached: a login with passwordless sudo, host keys verified against a known_hosts file.
login = {
    "ssh_user": "deploy",
    "_sudo": True,
    "ssh_known_hosts_file": "~/.ssh/fleet_known_hosts",
    "ssh_strict_host_key_checking": "yes",
}

# One instance on the host's 8 GPUs, one tensor-parallel group across them (8 must divide the model's
# attention heads, 64 for Llama-3.1-70B: the plan checks it against the model's config.json).
all_8_gpus = {"gpus": 8, "flags": {"tensor_parallel_size": 8}}

gpu_hosts = [
    ("gpu01", {**login, "ssh_hostname": "10.0.0.11", "vllm": all_8_gpus}),
    ("gpu02", {**login, "ssh_hostname": "10.0.0.12", "vllm": all_8_gpus}),
    ("gpu03", {**login, "ssh_hostname": "10.0.0.13", "vllm": all_8_gpus}),
    ("gpu04", {**login, "ssh_hostname": "10.0.0.14", "vllm": all_8_gpus}),
]
