"""An example of a mixed fleet, runnable against the lab: `vllm-fleet plan inventories/example.py`.

lab1 plays a CPU host serving the tiny model. lab2 plays an 8-GPU server with two instances (a chat
model on GPUs 0-3, a second on 4-7); in the lab it has no GPU, so the plan refuses it with what to
install, unless a test has given it a captured nvidia-smi (tests/hosts/test_gpu_simulated.py).
Real fleets write the same dicts with their own addresses, users and model paths.
"""

from fleet import lab
from fleet.lab_inventory import TINY_MODEL, lab_vllm

_ssh = {"ssh_user": "root", "ssh_key": str(lab.ssh_key()), "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "no"}

cpu_hosts = [("lab1", {**_ssh, "ssh_hostname": "10.77.1.2", "vllm": lab_vllm(1)})]

gpu_hosts = [
    ("lab2", {**_ssh, "ssh_hostname": "10.77.2.2", "vllm": {
        "accelerator": "cuda",
        "model": {"name": "tiny-llama", "path": str(TINY_MODEL)},
        "flags": {"max_model_len": 2048, "host": "0.0.0.0"},  # served to the network: the key is required
        "instances": [
            {"name": "chat", "gpus": [0, 1, 2, 3]},
            {"name": "chat-b", "gpus": [4, 5, 6, 7], "flags": {"port": 8001, "max_num_seqs": 128}},
        ],
    }}),
]
