"""docs/inventory.md's key tables, generated from the schema: a default is defined once, where the
field is, and documented beside it (the field's docstring), as a well-kept Ansible role documents
defaults/main.yml in place.

A field's docstring is its meaning; a last paragraph may hold `default: <text>` (for a default the
planner derives, which the schema cannot show as a value) and `from: <text>` (where the value comes
from, e.g. a seed). `python -m vllm_fleet.core.keydoc docs/inventory.md` rewrites the tables between
their markers; tests/unit/test_inventory_doc.py fails when the page is not current.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from vllm_fleet.core.flags import ServeFlags
from vllm_fleet.core.spec import HostSpec, InstanceSpec, WatchdogSpec

# marker name -> (model, the first column's heading)
TABLES: dict[str, tuple[type[BaseModel], str]] = {
    "HostSpec": (HostSpec, "key"), "InstanceSpec": (InstanceSpec, "key"),
    "WatchdogSpec": (WatchdogSpec, "key"), "ServeFlags": (ServeFlags, "flag"),
}
BEGIN = "<!-- {name}: generated from the schema by `python -m vllm_fleet.core.keydoc`; edit the field -->"
END = "<!-- end {name} -->"


def shown(value: object) -> str:
    """A concrete default, as the tables write it."""
    if isinstance(value, bool) or value == {}:
        return f"`{value}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, float):
        return f"`{value:.2f}`"
    if isinstance(value, list):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    return f"`{value}`"


def docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Each field's docstring (the string right after it), read from the class's source: only when the
    page is generated, so importing the schema parses no source (pydantic's use_attribute_docstrings
    would, on every run)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found = {}
    for st, after in zip(body, body[1:], strict=False):
        if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            found[st.target.id] = inspect.cleandoc(after.value.value)
    return found


def row(model: type[BaseModel], name: str) -> tuple[str, str, str, str]:
    """(key, default, from, meaning) of one field."""
    field = model.model_fields[name]
    doc = docstrings(model).get(name)
    if not doc:
        raise ValueError(f"{model.__name__}.{name} has no docstring: document it where it is defined")
    paragraphs = doc.strip().split("\n\n")
    notes: dict[str, str] = {}
    if all(re.match(r"(default|from): ", ln) for ln in paragraphs[-1].splitlines()):
        notes = dict(ln.split(": ", 1) for ln in paragraphs.pop().splitlines())
    meaning = " ".join(" ".join(paragraphs).split())
    value = field.get_default(call_default_factory=True)
    concrete = value is not PydanticUndefined and value is not None and not isinstance(value, BaseModel)
    if "default" in notes and concrete:  # the schema's value is the one the page shows
        raise ValueError(f"{model.__name__}.{name}: `default:` in its docstring contradicts its value "
                         f"{value!r}")
    if "default" in notes:
        default = notes["default"]
    elif value is PydanticUndefined:
        default = "required"
    elif value is None:
        default = "none"
    else:
        default = shown(value)
    return f"`{name}`", default, notes.get("from", ""), meaning


def table(model: type[BaseModel], first: str) -> str:
    last = "notes" if first == "flag" else "meaning"
    lines = [f"| {first} | default | from | {last} |", "|---|---|---|---|"]
    for name in model.model_fields:
        lines.append("| " + " | ".join(row(model, name)) + " |")
    return "\n".join(line.replace("|  |", "| |") for line in lines)  # an empty cell as the page writes it


def update(text: str) -> str:
    """The page with every marked table regenerated; everything else as it was."""
    for name, (model, first) in TABLES.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        if begin not in text or end not in text:
            raise ValueError(f"the page has no {name} table markers")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{table(model, first)}\n{end}{tail}"
    return text


def releases() -> str:
    """The release table as an operator needs it: per vLLM release, each build and what it asks of a host."""
    from vllm_fleet.core.variants import load_table

    lines = ["releases vllm-fleet can install (a version not listed is refused):"]
    for version, builds in load_table().items():
        parts = []
        for v in builds.values():
            if v.accelerator == "cpu":
                parts.append(f"{v.name} (CPU)")
            else:
                cc = ".".join(map(str, v.min_compute_capability))
                parts.append(f"{v.name} (CUDA {v.cuda}, driver >= {v.min_driver}, "
                             f"compute capability >= {cc})")
        lines.append(f"  {version}: " + "; ".join(parts))
        lines += [f"    {v.name}: {v.proof_line()}" for v in builds.values()]
    return "\n".join(lines)


def all_keys() -> list[str]:
    """Every inventory key, as `explain` accepts it: the host's, then an instance's, the watchdog's and
    the serve flags' (under `flags`)."""
    prefix = {"HostSpec": "", "InstanceSpec": "instances.", "WatchdogSpec": "watchdog.",
              "ServeFlags": "flags."}
    return [prefix[name] + key for name, (model, _) in TABLES.items() for key in model.model_fields]


def explain(key: str) -> str:
    """What one inventory key means, its default and where the default comes from: the reference a wheel
    user has without the source checkout. `key` may be written with its section (`flags.max_num_seqs`)
    or bare (`max_num_seqs`), which answers for every section that has it."""
    wanted = key.strip().removeprefix("vllm.").replace("-", "_")
    if wanted.startswith("instances.") and wanted.count(".") > 1:  # instances.flags.port: an instance's flag
        wanted = wanted.removeprefix("instances.")
    found = [k for k in all_keys() if k == wanted or k.rsplit(".", 1)[-1] == wanted]
    if not found:
        raise KeyError(f"{key!r} is not an inventory key; `vllm-fleet explain` lists them")
    out = []
    models: dict[str, type[BaseModel]] = {"": HostSpec, "instances": InstanceSpec, "watchdog": WatchdogSpec,
                                          "flags": ServeFlags}
    for k in found:
        section, _, name = k.rpartition(".")
        _, default, source, meaning = row(models[section], name)
        text = [f"vllm.{k}", f"  default: {default.strip('`')}" + (f" (from {source})" if source else "")]
        if section == "flags":
            text.append(f"  vllm serve --{name.replace('_', '-')}")
        text.extend("  " + ln for ln in textwrap.wrap(meaning, 100))
        out.append("\n".join(text))
        if k == "version":
            out.append(releases())
    return "\n\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m vllm_fleet.core.keydoc PAGE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(update(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
