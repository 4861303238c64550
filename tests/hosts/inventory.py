"""The lab inventory with per-test overrides (VLLM_FLEET_TEST_OVERRIDES: {"lab2": {...vllm...}})."""

import json
import os

from fleet.lab_inventory import lab_hosts
from fleet.spec import deep_merge

_over = json.loads(os.environ.get("VLLM_FLEET_TEST_OVERRIDES", "{}"))
# {"__replace__": {"lab2": {...}}} puts a whole vllm dict in place of the lab's (bad-inventory tests)
_replace = _over.pop("__replace__", {})
lab = [(name, {**data, "vllm": _replace[name] if name in _replace else deep_merge(data["vllm"],
                                                                                  _over.get(name, {}))})
       for name, data in lab_hosts()]
