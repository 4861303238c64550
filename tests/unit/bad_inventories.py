"""Bad `vllm` host dicts, each with the field path and the words the refusal must contain.

Each entry: (description, host data, field path substring, words the message must contain).
The path substring is matched against the problem line after "host: vllm."; the words are matched
case-insensitively anywhere in the same line.
"""

from __future__ import annotations

from typing import Any

M = {"name": "qwen", "path": "/srv/models/qwen"}


def one(**extra: Any) -> dict[str, Any]:
    """One-instance shorthand with a valid model plus `extra`."""
    return {"model": M, **extra}


def flags(**f: Any) -> dict[str, Any]:
    return {"model": M, "flags": f}


BadHost = tuple[str, dict[str, Any], str, tuple[str, ...]]

BAD_HOSTS: list[BadHost] = [
    # --- flag names ------------------------------------------------------------------------------------
    ("typo max_num_seq", flags(max_num_seq=128), "instances[0].flags.max_num_seq",
     ("not a known serve flag", "did you mean", "max_num_seqs")),
    ("typo gpu_memory_utilisation", flags(gpu_memory_utilisation=0.8),
     "instances[0].flags.gpu_memory_utilisation", ("did you mean", "gpu_memory_utilization")),
    ("typo kebab max-model-length", flags(**{"max-model-length": 4096}),
     "instances[0].flags.max_model_length",
     ("did you mean", "max_model_len")),
    ("unknown flag without close match", flags(frobnicate=True), "instances[0].flags.frobnicate",
     ("not a known serve flag", "extra_args")),
    ("removed swap_space", flags(swap_space=4), "instances[0].flags.swap_space", ("removed", "0.18")),
    ("removed swap-space kebab", flags(**{"swap-space": 4}), "instances[0].flags.swap_space", ("0.18",)),
    ("inline api_key in flags", flags(api_key="sk-live-123"), "instances[0].flags.api_key",
     ("never written", "api_key_env")),
    ("inline hf_token in flags", flags(hf_token="hf_abc"), "instances[0].flags.hf_token",
     ("never written", "hf_token_env")),
    # --- extra_args ------------------------------------------------------------------------------------
    ("extra_args inline api-key", flags(extra_args={"api-key": "sk-live-123"}),
     "instances[0].flags.extra_args.api-key", ("api_key_env",)),
    ("extra_args short flag", flags(extra_args={"-q": "awq"}), "instances[0].flags.extra_args.-q",
     ("not a long flag name",)),
    ("extra_args upper-case name", flags(extra_args={"--Seed": 1}), "instances[0].flags.extra_args.--Seed",
     ("not a long flag name",)),
    ("extra_args duplicates typed flag", flags(extra_args={"--max-num-seqs": 64}),
     "instances[0].flags.extra_args.--max-num-seqs", ("typed field", "max_num_seqs")),
    ("extra_args duplicates typed flag snake", flags(extra_args={"tensor_parallel_size": 2}),
     "instances[0].flags.extra_args.tensor_parallel_size", ("typed field", "tensor_parallel_size")),
    ("extra_args removed swap-space", flags(extra_args={"--swap-space": 4}),
     "instances[0].flags.extra_args.--swap-space", ("0.18",)),
    ("extra_args nested dict value", flags(extra_args={"--seed": {"a": 1}}),
     "instances[0].flags.extra_args.--seed", ("valid",)),
    # --- flag values -----------------------------------------------------------------------------------
    ("gpu_memory_utilization above 1", flags(gpu_memory_utilization=1.5),
     "instances[0].flags.gpu_memory_utilization", ("less than or equal to 1",)),
    ("gpu_memory_utilization zero", flags(gpu_memory_utilization=0),
     "instances[0].flags.gpu_memory_utilization", ("greater than 0",)),
    ("gpu_memory_utilization percent string", flags(gpu_memory_utilization="90%"),
     "instances[0].flags.gpu_memory_utilization", ("valid number",)),
    ("port zero", flags(port=0), "instances[0].flags.port", ("greater than or equal to 1",)),
    ("port too high", flags(port=70000), "instances[0].flags.port", ("less than or equal to 65535",)),
    ("max_num_seqs zero", flags(max_num_seqs=0), "instances[0].flags.max_num_seqs",
     ("greater than or equal to 1",)),
    ("max_model_len tiny", flags(max_model_len=8), "instances[0].flags.max_model_len",
     ("greater than or equal to 16",)),
    ("block_size 17", flags(block_size=17), "instances[0].flags.block_size", ("not allowed", "16", "32")),
    ("dtype bf16 abbreviation", flags(dtype="bf16"), "instances[0].flags.dtype",
     ("'bf16' is not allowed", "bfloat16")),
    ("quantization int4", flags(quantization="int4"), "instances[0].flags.quantization",
     ("not allowed", "awq", "gptq")),
    ("kv_cache_dtype fp4", flags(kv_cache_dtype="fp4"), "instances[0].flags.kv_cache_dtype",
     ("not allowed", "fp8")),
    ("tensor_parallel_size zero", flags(tensor_parallel_size=0), "instances[0].flags.tensor_parallel_size",
     ("greater than or equal to 1",)),
    ("pipeline_parallel_size zero", flags(pipeline_parallel_size=0),
     "instances[0].flags.pipeline_parallel_size", ("greater than or equal to 1",)),
    ("trust_remote_code maybe", flags(trust_remote_code="maybe"), "instances[0].flags.trust_remote_code",
     ("valid boolean",)),
    ("shutdown_timeout negative", flags(shutdown_timeout=-1), "instances[0].flags.shutdown_timeout",
     ("greater than or equal to 0",)),
    ("served_model_name with spaces", flags(served_model_name="my model"),
     "instances[0].flags.served_model_name", ("should match pattern",)),
    ("batch budget below context, chunked prefill off",
     flags(max_num_batched_tokens=2048, max_model_len=8192, enable_chunked_prefill=False),
     "instances[0].flags", ("max_num_batched_tokens", "max_model_len", "chunked prefill")),
    ("flags not a mapping", one(flags="fast"), "instances[0].flags", ("valid dictionary",)),
    # --- model source ----------------------------------------------------------------------------------
    ("model without a source", one(model={"name": "qwen"}), "instances[0].model",
     ("exactly one", "path", "host_path", "hf_repo", "none")),
    ("model with two sources", one(model={"name": "qwen", "path": "/srv/q", "hf_repo": "Qwen/Qwen3-8B"}),
     "instances[0].model", ("exactly one", "'path'", "'hf_repo'")),
    ("relative host_path", one(model={"name": "qwen", "host_path": "models/qwen"}), "instances[0].model",
     ("host_path", "absolute")),
    ("model name with slash", one(model={"name": "../etc", "path": "/srv/q"}), "instances[0].model.name",
     ("should match pattern",)),
    ("hf_repo without org", one(model={"name": "qwen", "hf_repo": "Qwen3-8B"}), "instances[0].model.hf_repo",
     ("should match pattern",)),
    ("model without name", one(model={"path": "/srv/q"}), "instances[0].model.name", ("field required",)),
    ("typo in model key", one(model={"name": "qwen", "pth": "/srv/q"}), "instances[0].model.pth",
     ("not a known key",)),
    ("instance without model", {"instances": [{"name": "a"}]}, "instances[0].model", ("field required",)),
    # --- instances -------------------------------------------------------------------------------------
    ("no instances and no model", {"version": "0.32.0"}, "instances", ("at least 1",)),
    ("empty instances list", {"instances": []}, "instances", ("at least 1",)),
    ("instances not a list", {"instances": {"a": {"model": M}}}, "instances", ("valid list",)),
    ("instance name upper/underscore", one(name="Big_One"), "instances[0].name", ("should match pattern",)),
    ("instance name too long", one(name="a" * 40), "instances[0].name", ("should match pattern",)),
    ("duplicate instance names",
     {"instances": [{"name": "a", "model": M}, {"name": "a", "model": M, "flags": {"port": 8001}}]},
     "instances[1].name", ("'a'", "used twice")),
    ("two instances on one port",
     {"instances": [{"name": "a", "model": M}, {"name": "b", "model": M, "flags": {"port": 8000}}]},
     "instances[1].flags.port", ("8000", "already used", "'a'")),
    ("two instances on default port", {"instances": [{"name": "a", "model": M}, {"name": "b", "model": M}]},
     "instances[1].flags.port", ("8000", "already used")),
    ("typo in instance key", {"instances": [{"model": M, "gpu": 2}]}, "instances[0].gpu",
     ("not a known key",)),
    ("gpus as a word", one(gpus="two"), "instances[0].gpus", ("valid integer",)),
    ("cpu_kvcache_gib zero", one(cpu_kvcache_gib=0), "instances[0].cpu_kvcache_gib",
     ("greater than or equal to 1",)),
    ("port_protected_elsewhere sure", one(port_protected_elsewhere="sure"),
     "instances[0].port_protected_elsewhere", ("valid boolean",)),
    # --- secrets and environment -----------------------------------------------------------------------
    ("HF_TOKEN in env", one(env={"HF_TOKEN": "hf_abc"}), "instances[0].env", ("HF_TOKEN", "secret")),
    ("VLLM_API_KEY in env", one(env={"VLLM_API_KEY": "sk-1"}), "instances[0].env",
     ("VLLM_API_KEY", "secret")),
    ("password in env", one(env={"DB_PASSWORD": "x"}), "instances[0].env", ("DB_PASSWORD", "secret")),
    ("lower-case env name", one(env={"http_proxy": "http://p:3128"}), "instances[0].env",
     ("http_proxy", "not an environment variable name")),
    ("env value not a string", one(env={"VLLM_LOGGING_LEVEL": 10}), "instances[0].env.VLLM_LOGGING_LEVEL",
     ("valid string",)),
    ("api_key_env with dash", one(api_key_env="vllm-key"), "instances[0].api_key_env",
     ("should match pattern",)),
    ("hf_token_env starting with digit", one(hf_token_env="1TOKEN"), "instances[0].hf_token_env",
     ("should match pattern",)),
    # --- host level ------------------------------------------------------------------------------------
    ("version without patch", one(version="0.32"), "vllm.version", ("should match pattern",)),
    ("version latest", one(version="latest"), "vllm.version", ("should match pattern",)),
    ("version with v prefix", one(version="v0.32.0"), "vllm.version", ("should match pattern",)),
    ("accelerator rocm", one(accelerator="rocm"), "vllm.accelerator",
     ("'rocm' is not allowed", "cuda", "cpu")),
    ("install_source pip", one(install_source="pip"), "vllm.install_source",
     ("'pip' is not allowed", "cache", "registry")),
    ("keep_releases one", one(keep_releases=1), "vllm.keep_releases", ("greater than or equal to 2",)),
    ("ready_timeout_s too short", one(ready_timeout_s=5), "vllm.ready_timeout_s",
     ("greater than or equal to 10",)),
    ("unknown host key", one(modle={"name": "x"}), "vllm.modle", ("not a known key",)),
    ("negative GPU count", one(gpus=-1), "instances[0].gpus", ("greater than or equal to 1",)),
    ("zero GPU count", one(gpus=0), "instances[0].gpus", ("greater than or equal to 1",)),
    ("duplicate GPU indexes", one(gpus=[0, 0]), "instances[0].gpus", ("0",)),
    ("bind address with spaces", flags(host="not an address"), "instances[0].flags.host", ("host",)),
]

# Bad inventories the schema once accepted (fixed; kept empty so new findings have a home).
ACCEPTED_BUT_BAD: list[tuple[BadHost, str]] = []
