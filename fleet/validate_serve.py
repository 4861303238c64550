"""Have a release's own vLLM check a serve config the way it would start from it, without an engine.

Runs ON the host, with the new release's interpreter, before anything is switched or restarted: a flag,
a value or a combination vLLM refuses stops the deploy for that host while the old service keeps serving.

Three steps, each catching what the one before cannot:
1. exact option names (vLLM's parser accepts abbreviations: `--max-model 512` passes);
2. vLLM's parser on the file (`serve --config`), then every setting of the file compared with the
   namespace it produced: a dropped `false` or a list value whose words override another flag
   (`[hermes, --host, 0.0.0.0]`) is a difference, so a refusal; then `serve`'s own argument checks;
3. for a model on this host's disk, vLLM's own engine config built from that namespace
   (EngineArgs.create_engine_config: the model's config.json, quantization, context length, cache,
   scheduler and parallel checks), offline, and its settings compared with the file's.
The route is the same in vLLM 0.31-0.33.

Usage: python validate_serve.py CONFIG.yaml   (exit 0 = accepted; 1 = rejected, reason on stderr)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import effective  # noqa: E402  (uploaded beside this script)


def _refuse(msg: str) -> int:
    print(f"vLLM rejected the config: {msg}", file=sys.stderr)
    return 1


def _one_line(e: Exception) -> str:
    """pydantic's multi-line report as one line, without its type tags and links."""
    lines = [ln.strip() for ln in str(e).splitlines()
             if ln.strip() and not ln.strip().startswith("For further information")]
    text = re.sub(r"\s*\[type=[^\]]*\]", "", " ".join(lines))
    return f"{type(e).__name__}: {text[:1500]}"


def _namespace_differences(config: dict, options: dict, ns: argparse.Namespace) -> list[str]:
    parsed = {}
    for key in config:
        action = options[f"--{key}"]
        parsed[key.removeprefix(effective.NO) if key.startswith(effective.NO) else key] = getattr(
            ns, action.dest, None)
    return effective.differences(effective.expected(config), parsed, "vLLM's parser made it")


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a check never downloads
    import yaml
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    path = argv[0]
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subcommand")
    ServeSubcommand().subparser_init(sub)
    serve = sub.choices["serve"]
    options = {s: a for a in serve._actions for s in a.option_strings}
    with open(path) as f:
        config = yaml.safe_load(f) or {}
    unknown = [k for k in config if f"--{k}" not in options]
    if unknown:
        off = [k for k in unknown
               if k.startswith(effective.NO) and f"--{k.removeprefix(effective.NO)}" in options]
        hint = (f" ({', '.join(off)}: this vLLM has no way to turn these off; leave them out, off is "
                "their default)") if off else ""
        print(f"vLLM does not know these flags: {', '.join(unknown)}{hint}", file=sys.stderr)
        return 1
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["serve", "--config", path])
    except SystemExit as e:
        msg = [line for line in err.getvalue().splitlines() if "error" in line.lower()] or [err.getvalue()]
        _refuse(" ".join(msg).strip())
        return int(e.code or 1)
    except (ValueError, argparse.ArgumentError) as e:
        return _refuse(str(e))
    diff = _namespace_differences(config, options, ns)
    if diff:
        return _refuse("vLLM would not run with what the file says: " + "; ".join(diff))
    try:  # what `vllm serve` checks right after parsing (tool-call parser, chat template, ...)
        with contextlib.redirect_stdout(io.StringIO()):
            ServeSubcommand().validate(ns)
    except Exception as e:
        return _refuse(f"vLLM would refuse to start: {_one_line(e)}")
    model = getattr(ns, "model_tag", None) or getattr(ns, "model", None)
    if model and os.path.isdir(model):
        from vllm.engine.arg_utils import AsyncEngineArgs

        ns.model = model
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                vllm_config = AsyncEngineArgs.from_cli_args(ns).create_engine_config()
        except Exception as e:  # vLLM raises ValueError, pydantic's ValidationError, and others
            return _refuse(f"vLLM would refuse to start: {_one_line(e)}")
        diff = effective.differences(effective.expected(config), effective.engine_values(vllm_config),
                                     "vLLM's engine config has")
        if diff:
            return _refuse("vLLM would change these settings: " + "; ".join(diff))
        print("accepted (parser and engine config)")
        return 0
    print("accepted (parser; the model is not on this host yet, so vLLM checks it when it starts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
