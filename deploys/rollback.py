"""Roll the targeted hosts back one step: `pyinfra inventories/lab.py deploys/rollback.py --limit lab2`."""

from vllm_fleet.roles.rollback import rollback

rollback()
