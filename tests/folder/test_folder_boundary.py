"""The run folder's files are the folder package's: no module outside ``cosyclone/folder/`` names the
records file or the index file to open them (it asks :mod:`cosyclone.folder`), so the one record parser
and the one index are the only ways in. Naming them in a message (an f-string) is allowed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "cosyclone"
NAMES = {"DIAG_NAME", "INDEX_NAME"}  # the constants of the records file and the index file
FILES = {"diagnostics.jsonl", "index.sqlite"}


def _uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every use of the folder's file names outside an f-string and a docstring."""
    in_message: set[int] = set()
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            in_message |= {id(n) for n in ast.walk(node)}
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if id(node) in in_message or id(node) in docstrings:
            continue
        name = node.attr if isinstance(node, ast.Attribute) else None
        name = node.id if isinstance(node, ast.Name) else name
        if name in NAMES:
            found.append((getattr(node, "lineno", 0), str(name)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FILES:
            found.append((node.lineno, node.value))
    return found


def test_no_module_outside_the_folder_package_opens_the_records_or_the_index() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}"
           for path in sorted(PKG.rglob("*.py")) if PKG / "folder" not in path.parents
           for line, name in _uses(ast.parse(path.read_text(encoding="utf-8")))]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_use_and_lets_a_message_be() -> None:
    source = '"""diagnostics.jsonl"""\nopen(out / layout.DIAG_NAME)\nraise E(f"no {layout.DIAG_NAME}")\n'
    tree = ast.parse(source)
    assert _uses(tree) == [(2, "DIAG_NAME")]
