"""The docs' field tables, generated from the records' dataclasses (the comment beside each field).

``python -m tests.docs_tables`` rewrites every table in place; tests/docs/test_output_docs.py fails when
a table and its dataclass disagree. A table lives between ``<!-- fields: NAME -->`` and
``<!-- /fields -->`` in its Markdown file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from cosyclone.base.fieldtable import field_docs, markdown_table
from cosyclone.engine.facts import StageSeconds, StageTime
from cosyclone.eval.record import EvalRecord
from cosyclone.folder.row_record import RowRecord
from cosyclone.run.account import GraphsRecord, RunRecord
from cosyclone.talker.diagnostics import SamplerRowDiagnostics

ROOT = Path(__file__).resolve().parents[1]
#: table name -> (the dataclass, the Markdown file that holds its table)
TABLES: dict[str, tuple[type, Path]] = {
    "RowRecord": (RowRecord, ROOT / "docs" / "output.md"),
    "SamplerRowDiagnostics": (SamplerRowDiagnostics, ROOT / "docs" / "output.md"),
    "RunRecord": (RunRecord, ROOT / "docs" / "output.md"),
    "GraphsRecord": (GraphsRecord, ROOT / "docs" / "output.md"),
    "StageSeconds": (StageSeconds, ROOT / "docs" / "output.md"),
    "StageTime": (StageTime, ROOT / "docs" / "output.md"),
    "EvalRecord": (EvalRecord, ROOT / "docs" / "eval.md"),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- fields: {re.escape(name)} -->\n)(.*?)(<!-- /fields -->)", re.S)


def expected(name: str) -> str:
    return markdown_table(field_docs(TABLES[name][0]))


def found(name: str) -> str | None:
    """The table as the docs hold it now (None: the markers are missing)."""
    m = _pattern(name).search(TABLES[name][1].read_text(encoding="utf-8"))
    return m.group(2) if m else None

def _filler(table: str) -> Callable[[re.Match[str]], str]:
    """The substitution that puts ``table`` between a table's markers."""
    return lambda m: m.group(1) + table + m.group(3)


def rewrite() -> list[str]:
    """Every table rewritten from its dataclass; returns the names of the tables that changed."""
    changed = []
    for name, (_, path) in TABLES.items():
        text = path.read_text(encoding="utf-8")
        table = expected(name)
        new = _pattern(name).sub(_filler(table), text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(name)
    return changed


if __name__ == "__main__":
    print("rewrote:", ", ".join(rewrite()) or "nothing", file=sys.stderr)
