"""Have a release's own vLLM parse a serve config, without starting an engine.

Runs ON the host, with the new release's interpreter, before anything is switched or restarted: a flag
or value that vLLM rejects stops the deploy for that host while the old service keeps serving.

vLLM's parser is strict about types and choices but accepts abbreviations (`--max-model 512` passes),
so the config's keys are also checked for exact option names. The route (FlexibleArgumentParser plus
ServeSubcommand.subparser_init, then a strict parse_args so `--config` is expanded) is the same in
vLLM 0.31-0.33.

Usage: python validate_serve.py CONFIG.yaml   (exit 0 = accepted; 1 = rejected, reason on stderr)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys


def main(argv: list[str]) -> int:
    import yaml
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    path = argv[0]
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subcommand")
    ServeSubcommand().subparser_init(sub)
    serve = sub.choices["serve"]
    known = {s for a in serve._actions for s in a.option_strings}
    with open(path) as f:
        config = yaml.safe_load(f) or {}
    unknown = []
    for key, value in config.items():
        opt = f"--{key}"
        if isinstance(value, bool) and not value:
            # vLLM turns `x: false` into --no-x where that exists, else drops it
            continue
        if opt not in known:
            unknown.append(key)
    if unknown:
        print(f"vLLM does not know these flags: {', '.join(unknown)}", file=sys.stderr)
        return 1
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(["serve", "--config", path])
    except SystemExit as e:
        msg = [line for line in err.getvalue().splitlines() if "error" in line.lower()] or [err.getvalue()]
        print("vLLM rejected the config: " + " ".join(msg).strip(), file=sys.stderr)
        return int(e.code or 1)
    except (ValueError, argparse.ArgumentError) as e:
        print(f"vLLM rejected the config: {e}", file=sys.stderr)
        return 1
    print("accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
