"""The first two lab hosts as one node group: vLLM's multi-node mode, the head on lab1, a worker on lab2.

    pyinfra -y fleetlab/inventories/lab_cluster.py deploys/vllm.py

A third lab host, when up, is not part of it. Switching back:
`pyinfra -y fleetlab/inventories/lab.py deploys/vllm.py`.
"""

from fleetlab.inventory import lab_cluster_hosts

cluster = lab_cluster_hosts(2)
