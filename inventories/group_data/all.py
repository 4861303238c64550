"""Fleet-wide defaults, deep-merged under each host's `vllm` dict (a host's value wins).

Every key, its default and where the default comes from is documented in docs/inventory.md.
"""

vllm_defaults = {
    "version": "0.32.0",
    "install_source": "cache",
    "keep_releases": 3,
    "flags": {
        "gpu_memory_utilization": 0.90,  # seed 003; vLLM's own default is 0.92
        "max_num_seqs": 256,  # seed 003
        "host": "127.0.0.1",  # local only unless asked (seed 003)
        "port": 8000,
        "trust_remote_code": False,  # on only when the model card says so
    },
}
