"""Have a release's own vLLM check a serve config the way it would start from it, without an engine.

Runs ON the host, with the new release's interpreter, before anything is switched or restarted: a flag,
a value or a combination vLLM refuses stops the deploy for that host while the old service keeps serving.

Three steps, each catching what the one before cannot:
1. exact option names (vLLM's parser accepts abbreviations: `--max-model 512` passes);
2. vLLM's parser on the file (`serve --config`), then every setting of the file compared with the
   namespace it produced: a dropped `false` or a list value whose words override another flag
   (`[hermes, --host, 0.0.0.0]`) is a difference, so a refusal; then `serve`'s own argument checks;
3. for a model on this host's disk, vLLM's own engine config built from that namespace as `vllm serve`
   builds it (EngineArgs.create_engine_config: the model's config.json, quantization, context length,
   cache, scheduler and parallel checks, the platform's adjustments), offline; every setting of
   effective.ENGINE must come out as the file says. What vLLM decides later, in its workers (the
   attention backend, a hybrid model's block size), is not built here.
On success it writes CONFIG.yaml.at-default: the settings equal to the parser's defaults, which vLLM's
start-up log leaves out (the check after the restart reads it).
The route is the same in vLLM 0.31-0.33.

Usage: python validate_serve.py CONFIG.yaml   (exit 0 = accepted; 1 = rejected, reason on stderr)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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


def _parsed(config: dict, options: dict, ns: argparse.Namespace) -> dict:
    return {(key.removeprefix(effective.NO) if key.startswith(effective.NO) else key):
            getattr(ns, options[f"--{key}"].dest, None) for key in config}


def _at_default(config: dict, options: dict, serve: argparse.ArgumentParser, ns: argparse.Namespace) -> list:
    """Settings whose parsed value is the parser's default: vLLM leaves them out of its `non-default
    args` line, so the check after the restart needs to know them (written beside the staged file)."""
    out = []
    for key in config:
        dest = options[f"--{key}"].dest
        if getattr(ns, dest, None) == serve.get_default(dest):
            out.append(key.removeprefix(effective.NO) if key.startswith(effective.NO) else key)
    return sorted(out)


_HINTS = {"distributed-executor-backend": " (the CPU platform keeps 'uni' only with "
                                          "VLLM_ENABLE_V1_MULTIPROCESSING=0 in the instance's env)"}


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
    both = [k for k in config if f"{effective.NO}{k}" in config]
    if both:
        return _refuse(f"both {both[0]} and {effective.NO}{both[0]} are set: vLLM takes the last one")
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
    diff = effective.differences(effective.expected(config), _parsed(config, options, ns),
                                 "vLLM's parser made it")
    if diff:
        return _refuse("vLLM would not run with what the file says: " + "; ".join(diff))
    try:  # what `vllm serve` checks right after parsing (tool-call parser, chat template, ...)
        with contextlib.redirect_stdout(io.StringIO()):
            ServeSubcommand().validate(ns)
    except Exception as e:
        return _refuse(f"vLLM would refuse to start: {_one_line(e)}")
    model = getattr(ns, "model_tag", None) or getattr(ns, "model", None)
    engine = bool(model and os.path.isdir(model))
    if engine:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        ns.model = model
        try:  # as `vllm serve` builds it: the API server's defaults (batch sizes), headless for workers
            with contextlib.redirect_stdout(io.StringIO()):
                vllm_config = AsyncEngineArgs.from_cli_args(ns).create_engine_config(
                    usage_context=UsageContext.OPENAI_API_SERVER,
                    headless=bool(getattr(ns, "headless", False)))
        except Exception as e:  # vLLM raises ValueError, pydantic's ValidationError, and others
            return _refuse(f"vLLM would refuse to start: {_one_line(e)}")
        diff = effective.differences(effective.expected(config), effective.engine_values(vllm_config),
                                     "vLLM's engine config has")
        if diff:
            return _refuse("vLLM would change these settings: " + "; ".join(
                d + _HINTS.get(d.split(":", 1)[0], "") for d in diff))
    with open(f"{path}.at-default", "w") as f:
        json.dump(_at_default(config, options, serve, ns), f)
    if engine:
        print("accepted (parser and engine config)")
    else:
        print("accepted (parser; the model is not on this host yet, so vLLM checks it when it starts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
