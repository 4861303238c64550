#!/usr/bin/env python3
"""Read the Prometheus metric names a vLLM release exposes from its wheel, and write them into
vllm_fleet/data/metrics.toml.

Why: dashboards and alerts written against one release break on the next when vLLM renames a metric
(``vllm:gpu_cache_usage_perc`` became ``vllm:kv_cache_usage_perc``). The names here are read from the code
that registers them, so a panel or rule that uses a name some release in the table lacks fails a test
(tests/unit/test_observe.py) instead of drawing an empty panel on a customer's screen.

What is read: ``vllm/v1/metrics/loggers.py`` (the engine's stat logger, where every serving metric is
registered), parsed with ``ast``. Each ``*_counter_cls`` / ``*_gauge_cls`` / ``*_histogram_cls`` call
with a literal ``name="vllm:..."`` is one metric. A metric registered under an ``if`` is recorded with
that condition's source text: ``show_hidden_metrics`` means vLLM hides it unless
``--show-hidden-metrics-for-version`` is given, anything else (a LoRA config, KV-event settings) means it
exists only on some instances. Dashboards use unconditional names only.

A wheel is a local file or a URL (PyPI's files host): for a URL only the zip's directory and the one
member are fetched with HTTP range requests, not the whole wheel (several hundred MB for a CUDA build).
The module is the same in every build of a release (CUDA or CPU), so any x86_64 wheel of it will do.

    python scripts/release_metrics.py 0.34.0=https://files.pythonhosted.org/.../vllm-0.34.0-....whl \
        0.33.0=/var/cache/vllm-fleet/wheels/files/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python scripts/release_metrics.py --pypi 0.20.0 0.31.0 0.32.0 0.33.0 0.34.0 --write

Stdlib only; runs on the controller or any workstation.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import re
import sys
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

MEMBER = "vllm/v1/metrics/loggers.py"
TABLE = Path(__file__).resolve().parent.parent / "vllm_fleet" / "data" / "metrics.toml"
KINDS = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}


class RangeFile(io.RawIOBase):
    """A seekable read-only file over HTTP range requests: enough for ``zipfile`` to read the central
    directory at the end and one member."""

    def __init__(self, url: str) -> None:
        self.url, self.pos = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
            self.size = int(r.headers["Content-Length"])
        self.fetched = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=120) as r:
            data = r.read()
        self.pos += len(data)
        self.fetched += len(data)
        return data

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


# The API server's HTTP metrics come from prometheus-fastapi-instrumentator, which vLLM wires up in one
# of these modules (the place moved between releases); its series are named by that package.
INSTRUMENTATOR_HINT = re.compile(r"^vllm/entrypoints/.*(metrics|api_server)\.py$")
INSTRUMENTATOR_METRICS = {"http_requests_total": "counter", "http_request_duration_seconds": "histogram"}


def member_text(wheel: str) -> tuple[str, str, bool]:
    """The stat logger's source, where it came from (file name, and the member's sha256), and whether
    the API server registers prometheus-fastapi-instrumentator's HTTP metrics."""
    source = RangeFile(wheel) if wheel.startswith(("http://", "https://")) else open(wheel, "rb")  # noqa: SIM115
    with source, zipfile.ZipFile(source) as z:  # type: ignore[arg-type]
        data = z.read(MEMBER)
        http = any(b"Instrumentator(" in z.read(n) for n in z.namelist() if INSTRUMENTATOR_HINT.match(n))
    name = wheel.rsplit("/", 1)[-1].split("#", 1)[0]
    return data.decode("utf-8"), f"{name} ({MEMBER} sha256 {hashlib.sha256(data).hexdigest()[:16]})", http


def metrics(source: str) -> dict[str, dict[str, str]]:
    """name -> {"kind": counter|gauge|histogram, "condition": "" or the enclosing if's test}."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        kind = next((k for k in KINDS if re.search(rf"(^|_){k}(_cls)?$", func, re.I)), None)
        name = next((kw.value.value for kw in node.keywords if kw.arg == "name"
                     and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)), None)
        if kind is not None and name is None and any(kw.arg == "name" for kw in node.keywords):
            print(f"note: a {kind} registered under a computed name at line {node.lineno} is not read",
                  file=sys.stderr)
        if kind is None or name is None or not name.startswith("vllm:"):
            continue
        conditions, at = [], node
        while at in parents:
            parent = parents[at]
            if isinstance(parent, ast.If) and at in parent.body + parent.orelse:
                test = ast.unparse(parent.test)
                conditions.append(test if at in parent.body else f"not ({test})")
            at = parent
        condition = " and ".join(reversed(conditions))
        if name in found:  # registered twice (an if and its else): unconditional if either is
            earlier = found[name]["condition"]
            condition = "" if not (earlier and condition) else f"({earlier}) or ({condition})"
        found[name] = {"kind": kind, "condition": condition}
    return found


def pypi_wheel(release: str) -> str:
    """The x86_64 manylinux wheel of `vllm==release` on PyPI (its simple index, as pip reads it)."""
    with urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=60) as r:
        page = r.read().decode()
    pattern = rf'href="([^"]*/vllm-{re.escape(release)}-[^"]*manylinux[^"]*x86_64\.whl)[^"]*"'
    m = re.search(pattern, page)
    if not m:
        raise SystemExit(f"no x86_64 wheel of vllm {release} on PyPI")
    return m.group(1)


def render(table: dict[str, tuple[str, dict[str, dict[str, str]]]]) -> str:
    lines = [
        "# The Prometheus metrics each vLLM release registers, read from its wheel by",
        "# scripts/release_metrics.py (do not edit by hand: rerun it with --write).",
        "# Read by vllm_fleet/core/observe.py.",
        "#",
        "# Per release: `source` names the wheel and the module read; per metric its kind (a counter is",
        "# exposed with `_total`, a histogram as `_bucket`, `_sum`, `_count`) and, when it is registered",
        "# only under a condition, that condition's source (`show_hidden_metrics`: hidden unless vLLM is",
        "# started with --show-hidden-metrics-for-version). http_request* are",
        "# prometheus-fastapi-instrumentator's, listed when the release's API server registers it.",
    ]
    for release in sorted(table, key=lambda v: tuple(int(p) for p in re.findall(r"\d+", v))):
        source, names = table[release]
        lines += ["", f'[release."{release}"]', f"source = {json.dumps(source)}", ""]
        for name in sorted(names):
            m = names[name]
            lines += [f'[release."{release}".metric."{name}"]', f'kind = "{m["kind"]}"']
            if m["condition"]:
                lines.append(f"condition = {json.dumps(m['condition'])}")
    return "\n".join(lines) + "\n"


def table_cli(doc: str, table_path: Path, read: Callable[[str], tuple[str, Any, str]],
              render_table: Callable[[dict[str, tuple[str, Any]]], str]) -> int:
    """The release-table scripts' command line: each RELEASE=WHEEL (or release, with --pypi) read by
    `read(wheel)` -> (source, facts, a line for the operator); the table printed, or written."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("wheels", nargs="*", help="RELEASE=WHEEL (a path or URL), or a release with --pypi")
    ap.add_argument("--pypi", action="store_true", help="the arguments are releases: read PyPI's wheels")
    ap.add_argument("--write", action="store_true",
                    help=f"write {table_path.relative_to(table_path.parents[2])} with the releases given "
                         "(all of them: the file is the table)")
    args = ap.parse_args()
    table: dict[str, tuple[str, Any]] = {}
    for arg in args.wheels:
        release, wheel = (arg, pypi_wheel(arg)) if args.pypi else arg.split("=", 1)
        source, facts, line = read(wheel)
        table[release] = (source, facts)
        print(f"{release}: {line} from {source}", file=sys.stderr)
    out = render_table(table)
    if args.write:
        table_path.write_text(out)
        print(f"wrote {table_path}", file=sys.stderr)
    else:
        sys.stdout.write(out)
    return 0


def _read(wheel: str) -> tuple[str, dict[str, dict[str, str]], str]:
    text, source, http = member_text(wheel)
    found = metrics(text)
    if http:
        found |= {name: {"kind": kind, "condition": ""} for name, kind in INSTRUMENTATOR_METRICS.items()}
    hidden = sum(1 for m in found.values() if m["condition"])
    return source, found, f"{len(found)} metrics ({hidden} conditional)"


def main() -> int:
    return table_cli(__doc__ or "", TABLE, _read, render)


if __name__ == "__main__":
    sys.exit(main())
