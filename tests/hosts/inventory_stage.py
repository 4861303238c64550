"""Stage hosts: Debian 13 (trixie, Python 3.13) lab hosts whose nvidia-smi replays a captured H100
(tests/hosts/test_cuda_stage_lab.py puts it there), staging PyPI's CUDA 13 build of vLLM 0.33.0 from the
lab's PyPI mirror. lab5 installs from the controller's store, lab6 from the mirror itself.
VLLM_FLEET_STAGE_VERSION stages another release of the table's CUDA 13 builds (the release matrix)."""

import os

import fleetlab as lab
from fleetlab import pypimirror
from fleetlab.inventory import TINY_MODEL, connection

INSTALL_SOURCE = {"lab5": "cache", "lab6": "registry"}


def stage_vllm(name: str) -> dict:
    return {
        "version": os.environ.get("VLLM_FLEET_STAGE_VERSION", "0.33.0"),
        "accelerator": "cuda",
        "install_source": INSTALL_SOURCE.get(name, "cache"),
        "package_index": {"index_url": pypimirror.index_url()},
        "model": {"name": "tiny-llama", "path": str(TINY_MODEL)},
        "flags": {"max_model_len": 512, "max_num_seqs": 8, "enforce_eager": True},
    }


stage = [(h.name, {**connection(h), "vllm": stage_vllm(h.name)})
         for h in lab.read_state() if h.role == "stage"]
