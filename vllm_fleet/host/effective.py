"""What vLLM actually runs with, compared with what the plan rendered. Stdlib only: it also runs on the host.

A flag in a config file is no proof: vLLM's config loader silently drops `x: false` for flags its
top-level parser does not know (all of `serve`'s), and a list value is spliced into argv word by word,
so a later word can override an earlier flag. Two comparisons close that gap:

- before a restart, on the host, `validate_serve.py` builds vLLM's own engine config from the staged
  file and compares it with the file (`differences(expected(config), engine_values(vllm_config))`);
- after a restart, on the controller, the new process's start-up log (the `non-default args:` line of
  the API server and the engine's `with config:` line) is compared with the plan (`check_log`).

A difference is a refusal before the restart and a failed change (rolled back) after it.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

# The options whose value is a file or directory the service opens (read in vLLM 0.31-0.34's
# engine/arg_utils.py and entrypoints/openai/cli_args.py), read the same way by the plan (core/spec.py:
# paths the sandbox hides) and by the host check (validate_serve.py: each path opened as the service).
# Only absolute values are paths: the others are hub ids, keywords ('auto') or inline templates. Other
# options' JSON may hold strings that look like paths (a compile cache, a chat-template switch): those
# are vLLM's to create or read, not files the service must find.
READ_PATHS = frozenset({
    "chat-template", "tokenizer", "hf-config-path", "generation-config", "allowed-local-media-path",
    "lora-modules", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "tool-parser-plugin",
    "reasoning-parser-plugin", "log-config-file", "mm-encoder-fp8-scale-path", "speculative-config",
})
WRITE_PATHS = frozenset({"download-dir"})  # the service writes there (created when missing)
# JSON fields that name a path, where the option's value is an object (or a list of them)
JSON_PATH_FIELDS = {"lora-modules": ("path",), "speculative-config": ("model", "tokenizer")}
_LABELLED = re.compile(r"^[\w.-]+=(/.*)$")  # name=/path (LoRA modules)
# What the unit's sandbox (templates/sandbox.j2) keeps from the service: ProtectHome=yes hides the first
# three, PrivateTmp=yes gives it its own empty /tmp and /var/tmp.
SANDBOX_HIDDEN = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")
SANDBOX_HIDES = "the service's sandbox hides /home, /root and /run/user, and its /tmp is its own"


def config_paths(key: str, value: Any) -> list[str]:
    """The absolute paths one setting of a serve config names, as the service would open them."""
    if key not in READ_PATHS and key not in WRITE_PATHS:
        return []
    if isinstance(value, (list, tuple)):
        return [p for item in value for p in config_paths(key, item)]
    if isinstance(value, dict):
        fields = JSON_PATH_FIELDS.get(key, ())
        return [value[f] for f in fields if isinstance(value.get(f), str) and value[f].startswith("/")]
    if not isinstance(value, str):
        return []
    text = value.strip()
    if key in JSON_PATH_FIELDS and text[:1] in ("{", "["):
        try:
            return config_paths(key, json.loads(text))
        except ValueError:
            return []
    if text.startswith("/"):
        return [text]
    labelled = _LABELLED.match(text) if key == "lora-modules" else None
    return [labelled.group(1)] if labelled else []


def hidden_by_sandbox(path: str) -> bool:
    path = "/" + os.path.normpath(path).lstrip("/")  # //root/x and /srv/../root/x are /root/x
    return any(path == d or path.startswith(d + "/") for d in SANDBOX_HIDDEN)


# Rendered flag -> (attribute of vLLM's VllmConfig, key on the engine's start-up line or None).
# Read in vLLM 0.31-0.33: VllmConfig.__str__ (config/vllm.py) prints the keys named here.
ENGINE: dict[str, tuple[str, str | None]] = {
    "model": ("model_config.model", "model"),
    "served-model-name": ("model_config.served_model_name", "served_model_name"),
    "trust-remote-code": ("model_config.trust_remote_code", "trust_remote_code"),
    "dtype": ("model_config.dtype", "dtype"),
    "max-model-len": ("model_config.max_model_len", "max_seq_len"),
    "enforce-eager": ("model_config.enforce_eager", "enforce_eager"),
    "kv-cache-dtype": ("cache_config.cache_dtype", "kv_cache_dtype"),
    "enable-prefix-caching": ("cache_config.enable_prefix_caching", "enable_prefix_caching"),
    "enable-chunked-prefill": ("scheduler_config.enable_chunked_prefill", "enable_chunked_prefill"),
    "tensor-parallel-size": ("parallel_config.tensor_parallel_size", "tensor_parallel_size"),
    "pipeline-parallel-size": ("parallel_config.pipeline_parallel_size", "pipeline_parallel_size"),
    "max-num-seqs": ("scheduler_config.max_num_seqs", None),
    "max-num-batched-tokens": ("scheduler_config.max_num_batched_tokens", None),
    "block-size": ("cache_config.block_size", None),
    "gpu-memory-utilization": ("cache_config.gpu_memory_utilization", None),
    # the CPU platform turns "uni" into "mp" unless VLLM_ENABLE_V1_MULTIPROCESSING=0
    "distributed-executor-backend": ("parallel_config.distributed_executor_backend", None),
    "async-scheduling": ("scheduler_config.async_scheduling", None),
}
# Not compared with the engine: vLLM picks the kernel for a quantization method from the checkpoint and
# the GPU (gptq -> gptq_marlin / auto_gptq, awq -> auto_awq), which is no change of setting; the plan
# checks the method against the release and the checkpoint (vllm_fleet/core/startup.py).
# Values vLLM resolves itself: "auto" is a request, not a setting the engine reports back.
_UNRESOLVED = {"auto"}
NO = "no-"
NON_DEFAULT = "non-default args: "
ENGINE_MARK = " with config: "  # fixed strings: the host greps for both (grep -F)
ENGINE_LINE = re.compile(r"Initializing a V[0-9] LLM engine \(v[^)]*\) with config: ")


def expected(config: Mapping[str, Any], settings: Mapping[str, Sequence[Any]] | None = None
             ) -> dict[str, Any]:
    """A rendered config as the settings it means: `no-x: true` is x off. `settings` is what the host
    check found each key to mean in the release's own parser (key -> [setting, value]; validate_serve
    .meanings), for the keys whose spelling says otherwise: `disable-x: true` is x off on vLLM 0.33."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if settings and key in settings:
            setting, meant = settings[key]
            out[setting] = meant
        elif key.startswith(NO) and value is True:
            out[key.removeprefix(NO)] = False
        else:
            out[key] = value
    return out


def norm(value: Any, numbers: bool = True) -> str:
    """One spelling for a value however vLLM holds or prints it: torch.bfloat16, ['tiny'], 'x', 0.9 and
    0.90, 1 and 1.0, a JSON string and the dict vLLM parsed from it."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, (list, tuple)):
        return " ".join(norm(v, numbers) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    text = str(value).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if text.startswith("{") and text.endswith("}"):
        for load in (json.loads, ast.literal_eval):
            try:
                parsed = load(text)
            except (ValueError, SyntaxError):
                continue
            if isinstance(parsed, dict):
                return json.dumps(parsed, sort_keys=True)
    if text.startswith("[") and text.endswith("]"):
        return norm([p.strip() for p in text[1:-1].split(",") if p.strip()], numbers)
    text = text.removeprefix("torch.")
    if numbers and text not in ("True", "False"):
        try:
            return repr(float(text))
        except ValueError:
            pass
    return text


def differences(want: Mapping[str, Any], actual: Mapping[str, Any], where: str) -> list[str]:
    """Settings in `want` that `actual` holds differently; a missing key is not compared."""
    out = []
    for key, value in want.items():
        if key not in actual or norm(value) in _UNRESOLVED:
            continue
        if norm(value) != norm(actual[key]):
            out.append(f"{key}: the plan says {norm(value, False)}, {where} {norm(actual[key], False)}")
    return out


def engine_values(vllm_config: Any) -> dict[str, Any]:
    """The ENGINE settings of a built VllmConfig (host side, with the release's own vLLM)."""
    out = {}
    for flag, (path, _) in ENGINE.items():
        obj = vllm_config
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            out[flag] = obj
    return out


def _split_top(text: str, sep: str = ", ") -> list[str]:
    """Split on `sep` outside brackets and quotes (the engine line nests dicts and reprs)."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def parse_engine_line(line: str) -> dict[str, str]:
    m = ENGINE_LINE.search(line)
    if not m:
        return {}
    out = {}
    for part in _split_top(line[m.end():].strip()):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_non_default(line: str) -> dict[str, Any]:
    """The API server's `non-default args: {...}` (a dict repr; objects in it fall back to text)."""
    idx = line.find(NON_DEFAULT)
    if idx < 0:
        return {}
    body = line[idx + len(NON_DEFAULT):].strip()
    try:
        value = ast.literal_eval(body)
        if isinstance(value, dict):
            return value
    except (ValueError, SyntaxError):
        pass
    out: dict[str, Any] = {}
    for part in _split_top(body.strip("{}")):
        key, sep, value = part.partition(": ")
        if sep:
            out[key.strip().strip("'\"")] = value.strip()
    return out


def from_log(lines: Iterable[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(non-default args, engine line) of the last start in `lines`."""
    args: dict[str, Any] = {}
    engine: dict[str, str] = {}
    for line in lines:
        if NON_DEFAULT in line:
            args = parse_non_default(line)
        elif ENGINE_LINE.search(line):
            engine = parse_engine_line(line)
    return args, engine


def check_log(config: Mapping[str, Any], lines: Iterable[str], at_default: Collection[str] | None = None,
              settings: Mapping[str, Sequence[Any]] | None = None) -> tuple[list[str], int]:
    """Compare a rendered config with a start-up log: (differences, settings the log confirmed).

    The engine line is the truth for the settings it prints (vLLM may resolve or override them while
    building its config); the API server's non-default args for the rest. A setting equal to vLLM's
    parser default is absent from that line: `at_default` names those, as the host check found them
    before the restart (None: not known, such a setting is not counted). Any other setting missing from
    both lines was not taken, so it is a difference.
    """
    args, engine = from_log(lines)
    missing = [name for name, found in (("the engine's config line", engine),
                                        ("the API server's non-default args line", args)) if not found]
    if missing:
        return [f"the start-up log has no {' and no '.join(missing)} (vLLM logs both at INFO; journald "
                "must keep them)"], 0
    want = expected(config, settings)
    on_line = {flag: engine[key] for flag, (_, key) in ENGINE.items() if key and key in engine}
    in_args = {k.replace("_", "-"): v for k, v in args.items()}
    problems = differences({k: v for k, v in want.items() if k in on_line}, on_line, "vLLM runs with")
    rest = {k: v for k, v in want.items() if k not in on_line}
    problems += differences(rest, in_args, "vLLM parsed")
    if at_default is not None:
        problems += [f"{k}: the plan says {norm(v, False)}, vLLM's start-up log does not have it"
                     for k, v in rest.items() if k not in in_args and k not in at_default]
    confirmed = sum(1 for k in want if k in on_line or k in in_args)
    return problems, confirmed
