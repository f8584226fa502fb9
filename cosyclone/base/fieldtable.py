"""A dataclass's fields with the comment written beside each, for tables in the docs.

Why comments rather than ``field(metadata=...)``: records and options keep whisper's style, one
line per field with its meaning beside it, and the docs' field tables are generated from those
same lines, so a field cannot be added, renamed or redefined without its table following. A
comment continued on the next line (a line holding only a comment) belongs
to the field above it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldDoc:
    """One documented field."""

    name: str  # the field's name
    type: str  # its annotation as written in the source
    doc: str  # the comment beside it (and on the comment-only lines below it)


def field_docs(cls: type) -> list[FieldDoc]:
    """The fields of dataclass ``cls`` with their annotations and comments: its own fields first, then
    those of its bases in method resolution order (a field is documented where it is declared).

    Raises ``ValueError`` naming a field that has no comment: every field of a documented record
    says what it holds.
    """
    comments: dict[str, str] = {}
    types: dict[str, str] = {}
    for owner in reversed(cls.__mro__):  # a subclass's own comment wins over its base's
        if dataclasses.is_dataclass(owner) and owner is not object:
            own_types, own_docs = _declared(owner)
            types.update(own_types)
            comments.update(own_docs)
    out = []
    order = {
        name: rank
        for rank, name in enumerate(n for c in cls.__mro__ for n in c.__dict__.get("__annotations__", {}))
    }
    for f in sorted(dataclasses.fields(cls), key=lambda f: order.get(f.name, len(order))):  # own fields first
        doc = comments.get(f.name, "")
        if not doc:
            raise ValueError(f"{cls.__name__}.{f.name} has no comment: say what it holds")
        out.append(FieldDoc(name=f.name, type=types.get(f.name, str(f.type)), doc=doc))
    return out


def _declared(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """(annotation, comment) of each field the class body of ``cls`` itself declares."""
    source = textwrap.dedent(inspect.getsource(cls))
    names = set(cls.__dict__.get("__annotations__", {}))
    comments: dict[str, list[str]] = {}
    types: dict[str, str] = {}
    current: str | None = None
    depth = 0
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type == tokenize.NAME and depth == 0 and tok.start[1] == 4 and tok.string in names:
            line = lines[tok.start[0] - 1]
            if line[4 + len(tok.string):].lstrip().startswith(":"):
                current = tok.string
                types[current] = line.split(":", 1)[1].split("=", 1)[0].split("#", 1)[0].strip()
                comments.setdefault(current, [])
        elif tok.type == tokenize.NAME and depth == 0 and tok.start[1] == 4:
            current = None  # a method or another statement: comments below are not a field's
        elif tok.type == tokenize.COMMENT and current is not None:
            comments[current].append(tok.string.lstrip("#").strip())
    return types, {k: " ".join(c for c in v if c) for k, v in comments.items()}


def markdown_table(docs: list[FieldDoc]) -> str:
    """The fields as a Markdown table (``| field | type | meaning |``), one row each."""
    rows = ["| field | type | meaning |", "|---|---|---|"]
    rows += [f"| `{d.name}` | `{_cell(d.type)}` | {_cell(d.doc)} |" for d in docs]
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (a bare ``|`` would start a new cell, ``<x>`` an HTML tag)."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
