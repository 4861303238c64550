"""Every option of each vLLM release's `vllm serve` parser, read by the release itself, for
vllm_fleet/data/options/<release>.json.

  python scripts/release_options.py 0.32.0 lab1:/opt/vllm/releases/0.32.0-cpu/bin/python --write
  python scripts/release_options.py 0.33.0 /opt/venvs/vllm-0.33/bin/python          (this machine)

DUMP runs with the release's own interpreter (stdlib and vLLM), device-neutral (VLLM_TARGET_DEVICE=cpu,
so a CUDA build is read on a host without a GPU), builds the parser as `vllm serve` builds it, and lists
every option string the parser takes, hidden ones included (0.33 hides `--no-enable-x`): the setting it
is (dest), whether it takes a value and of which type, what a value-less one stores (so `--no-x` and
`--disable-x` say they turn a setting off), its default and its choices. A `lab<N>:` prefix runs it on
that lab host over SSH. The plan reads these files to refuse, before any host is touched, a flag the
release does not have; the host check still asks the release itself.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "vllm_fleet" / "data" / "options"

DUMP = r'''
import argparse, json, os
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import vllm
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser(prog="vllm")
sub = p.add_subparsers(dest="subcommand")
ServeSubcommand().subparser_init(sub)
s = sub.choices["serve"]
listed = {o for a in s._actions for o in a.option_strings}

def plain(v):
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return repr(v)

out = {}
for opt, a in sorted(s._option_string_actions.items()):
    if not opt.startswith("--") or isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
        continue
    e = {"dest": a.dest, "value": a.nargs != 0, "default": plain(s.get_default(a.dest))}
    if a.nargs == 0:
        ns = argparse.Namespace()
        try:
            a(s, ns, [], opt)
            e["sets"] = plain(getattr(ns, a.dest, None))
        except Exception as err:
            e["sets"] = "?" + type(err).__name__
    elif a.type is not None:
        e["type"] = getattr(a.type, "__name__", repr(a.type))
    if a.choices is not None:
        e["choices"] = sorted(str(c) for c in a.choices)
    if opt not in listed:
        e["hidden"] = True
    out[opt[2:]] = e
print("##OPTIONS " + json.dumps({"vllm": vllm.__version__, "options": out}, sort_keys=True))
'''


def dump(python: str) -> dict:
    """Run DUMP with `python`, here or (lab<N>:path) on a lab host."""
    host, _, path = python.rpartition(":")
    cmd = f"{shlex.quote(path)} -c {shlex.quote(DUMP)}"
    if host:
        sys.path.insert(0, str(ROOT))
        import fleetlab as lab

        out = lab.ssh(lab.LabHost(int(host.removeprefix("lab"))), cmd, timeout=600).stdout
    else:
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=600).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("##OPTIONS ")), None)
    if line is None:
        raise SystemExit(f"{python}: the parser could not be read:\n{out[-2000:]}")
    return json.loads(line.removeprefix("##OPTIONS "))


def _release(version: str) -> str:
    """'0.33.0+cu130' or '0.33.0.post1' -> '0.33.0' (vllm_fleet.core.flags.version_tuple's reading)."""
    return ".".join(re.findall(r"\d+", version.split("+")[0])[:3])


def render(found: dict) -> str:
    """One option a line, sorted: a new release's file diffs against the last one line by line."""
    lines = [f' "source": {json.dumps(found["source"])},', f' "vllm": {json.dumps(found["vllm"])},',
             ' "options": {']
    opts = found["options"]
    lines += [f"  {json.dumps(k)}: {json.dumps(opts[k], sort_keys=True)}," for k in sorted(opts)]
    lines[-1] = lines[-1].rstrip(",")
    return "{\n" + "\n".join(lines) + "\n }\n}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("release")
    ap.add_argument("python", help="the release's interpreter: PATH here, or lab<N>:PATH on a lab host")
    ap.add_argument("--source", default="", help="how the release was installed, for the file's record")
    ap.add_argument("--write", action="store_true", help="write vllm_fleet/data/options/<release>.json")
    args = ap.parse_args()
    found = dump(args.python)
    if _release(found["vllm"]) != _release(args.release):
        raise SystemExit(f"{args.python} runs vLLM {found['vllm']}, not {args.release}")
    found["source"] = args.source or args.python
    hidden = sum(1 for o in found["options"].values() if o.get("hidden"))
    print(f"{args.release}: {len(found['options'])} options ({hidden} hidden) from {found['source']}",
          file=sys.stderr)
    text = render(found)
    if args.write:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        (OUT_DIR / f"{_release(args.release)}.json").write_text(text)  # as flags.release_options reads it
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
