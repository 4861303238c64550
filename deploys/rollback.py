"""Roll the targeted hosts back one step: `pyinfra INVENTORY deploys/rollback.py --limit HOST`
(`vllm-fleet rollback INVENTORY` runs it wave by wave); on the lab:
`pyinfra fleetlab/inventories/lab.py deploys/rollback.py --limit lab2`."""

from vllm_fleet import rollback_vllm

rollback_vllm()
