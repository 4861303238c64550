"""The lab's mixed fleet, runnable against it: `vllm-fleet plan fleetlab/inventories/example.py`.

lab1 plays a CPU host serving the tiny model; lab8 a database host in the same inventory (no vLLM).
lab2 plays an 8-GPU server with two instances (a chat model on GPUs 0-3, a second on 4-7); in the lab it
has no GPU, so the plan refuses it with what to install, unless a test has given it a captured
nvidia-smi (tests/hosts/test_gpu_simulated.py).
Real fleets write the same dicts with their own addresses, users and model paths, as plain data
(inventories/gpu_fleet.py); this one imports the lab only for its key, known_hosts file and model.
"""

import fleetlab as lab
from fleetlab.inventory import TINY_MODEL, lab_vllm

# what a fleet's inventory says for every host: a login with passwordless sudo, host keys verified
_ssh = {"ssh_user": "deploy", "_sudo": True, "ssh_key": str(lab.ssh_key()),
        "ssh_known_hosts_file": str(lab.KNOWN_HOSTS), "ssh_strict_host_key_checking": "yes"}

cpu_hosts = [("lab1", {**_ssh, "ssh_hostname": "10.77.1.2", "vllm": lab_vllm(1)})]

# not a vLLM host: no vllm data, so the vLLM deploys leave it alone (another deploy can configure it)
db_hosts = [("lab8", {**_ssh, "ssh_hostname": "10.77.8.2"})]

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
