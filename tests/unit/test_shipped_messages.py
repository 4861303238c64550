"""What a wheel user reads names nothing they lack: no string the package ships (a message, a table, a
help text) points into the source checkout (docs/, tests/, the lab, the repository's own paths).

Docstrings and comments are the code's, not the user's, and are left out; every other string literal of
the installed modules (vllm_fleet/ and roles/) is read.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [p for d in ("vllm_fleet", "roles") for p in sorted((ROOT / d).rglob("*.py"))]
# a path into the checkout: its folders, or a Markdown document
REPO_PATH = re.compile(r"(?<![\w/.-])(?:docs|tests|fleetlab|bench|scripts|inventories|roles|templates|"
                       r"vllm_fleet)/[\w./-]*|\b[\w-]+\.md\b")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def shipped_paths() -> list[str]:
    found = []
    for path in SHIPPED:
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for m in REPO_PATH.finditer(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {m.group(0)}")
    return found


def test_no_shipped_string_names_a_repository_path():
    assert shipped_paths() == []


def test_the_check_sees_a_path_in_a_message():
    tree = "raise SystemExit(f'see docs/operations.md for {x}')"
    consts = [n.value for n in ast.walk(ast.parse(tree)) if isinstance(n, ast.Constant)]
    assert any(REPO_PATH.search(c) for c in consts)
