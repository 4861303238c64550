"""Fleet-wide choices, given to every host of an inventory in this folder (pyinfra's group data).

`vllm_defaults` is deep-merged under each host's `vllm` data (a host's own value wins) and validated
with it. Only what this fleet chooses differently from the schema's defaults is written here.
"""

vllm_defaults = {
    # pinned: the default is the release this vllm-fleet was tested with, which moves when it is upgraded
    "version": "0.33.0",
    # from the hub; the revision (default `main`) is resolved to a commit at plan time
    "model": {"name": "llama-70b", "hf_repo": "meta-llama/Llama-3.1-70B-Instruct"},
    # controller variables: the fleet's API key, and a hub token for this gated model (never in a file here)
    "api_key_env": "FLEET_API_KEY",
    "hf_token_env": "HF_TOKEN",
    # the site's PyPI mirror: the controller resolves each release's lock there, and the hosts install
    # that lock from it themselves instead of receiving the wheels from the controller
    "package_index": {"index_url": "https://pypi.internal/simple"},
    "install_source": "registry",
    # served to the network (the key is then required), at the context length the application needs
    "flags": {"host": "0.0.0.0", "max_model_len": 32768},
}
