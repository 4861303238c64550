"""How each vLLM release's parser spells a boolean turned off, read from its wheel, for
vllm_fleet/data/parser.toml.

  python scripts/release_parser.py --pypi 0.20.0 0.31.0 0.32.0 0.33.0 0.34.0 --write
  python scripts/release_parser.py 0.33.0=/path/to/vllm-0.33.0-...whl

vLLM 0.33 registers its own action for every BooleanOptionalAction: `--enable-x` gets the inverse
alias `--disable-x` (and the reverse), and `--no-enable-x`, still accepted, leaves the help and the
action's option_strings. Which releases do that, and with which prefixes, is read from the module that
defines the parser (the first of MEMBERS the wheel has) with `ast`, never imported: the action class
that sets `_inverse_prefixes` and subclasses BooleanOptionalAction, the parser's
`register("action", BooleanOptionalAction, <that class>)`, and whether the registration puts
`visible_option_strings` in place of option_strings (the hidden `--no-` form). A release without them
turns off with `--no-x` alone. The module is the same Python source in every build of a release (the
lab's 0.31.0 and 0.32.0 CPU builds hold PyPI's CUDA wheels' file, by sha256), so one row per release.
Wheels on PyPI are read with HTTP range requests (scripts/release_metrics.py): the zip's directory and
one member.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from release_metrics import RangeFile, table_cli  # noqa: E402

MEMBERS = ("vllm/utils/argparse_utils.py", "vllm/utils/__init__.py", "vllm/utils.py")
TABLE = Path(__file__).resolve().parent.parent / "vllm_fleet" / "data" / "parser.toml"


def negation(text: str) -> dict[str, object]:
    """{"inverse_prefixes": {...}, "no_form_hidden": bool} of the parser module's source."""
    tree = ast.parse(text)
    actions: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "BooleanOptionalAction" for b in node.bases):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and "_inverse_prefixes" in [
                        t.id for t in stmt.targets if isinstance(t, ast.Name)]:
                    actions[node.name] = ast.literal_eval(stmt.value)
    registered = None
    hidden = False
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "register"
                and [ast.unparse(a) for a in node.args][:2] == ["'action'", "BooleanOptionalAction"]
                and len(node.args) == 3 and ast.unparse(node.args[2]) in actions):
            registered = ast.unparse(node.args[2])
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "visible_option_strings"
                and any(isinstance(t, ast.Attribute) and t.attr == "option_strings" for t in node.targets)):
            hidden = True
    if registered is None:
        return {"inverse_prefixes": {}, "no_form_hidden": False}
    return {"inverse_prefixes": actions[registered], "no_form_hidden": hidden}


def read(wheel: str) -> tuple[str, str]:
    """(the parser module's source, where it came from: file name, member and its sha256)."""
    source = RangeFile(wheel) if wheel.startswith(("http://", "https://")) else open(wheel, "rb")  # noqa: SIM115
    with source, zipfile.ZipFile(source) as z:  # type: ignore[arg-type]
        names = set(z.namelist())
        member = next((m for m in MEMBERS if m in names), None)
        if member is None:
            raise SystemExit(f"{wheel}: none of {', '.join(MEMBERS)} in the wheel")
        data = z.read(member)
    name = wheel.rsplit("/", 1)[-1].split("#")[0]
    return data.decode(), f"{name} ({member} sha256 {hashlib.sha256(data).hexdigest()[:16]})"


def render(table: dict[str, tuple[str, dict]]) -> str:
    lines = [
        "# How each vLLM release's `serve` parser turns a boolean off, read from its wheel by",
        "# scripts/release_parser.py (do not edit by hand: rerun it with --write).",
        "# Read by vllm_fleet/core/flags.py: the config says `disable-x: true` where the release pairs",
        "# `--enable-x` with `--disable-x` (inverse_prefixes), else `no-x: true`.",
        "# no_form_hidden: `--no-enable-x` is still accepted but hidden from help and option_strings.",
    ]
    for release in sorted(table, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v))):
        source, facts = table[release]
        inverse = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                            for k, v in facts["inverse_prefixes"].items())
        lines += ["", f'[release."{release}"]', f"source = {json.dumps(source)}",
                  f"inverse_prefixes = {{ {inverse} }}" if inverse else "inverse_prefixes = {}",
                  f"no_form_hidden = {'true' if facts['no_form_hidden'] else 'false'}"]
    return "\n".join(lines) + "\n"


def _read(wheel: str) -> tuple[str, dict, str]:
    text, source = read(wheel)
    facts = negation(text)
    return source, facts, str(facts)


def main() -> int:
    return table_cli(__doc__ or "", TABLE, _read, render)


if __name__ == "__main__":
    sys.exit(main())
