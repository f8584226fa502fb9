"""The deviations table of docs/text_frontend.md, read as data (the tests pin every row of it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "text_frontend.md"
VARIANTS = ("zs_zh", "zs_en", "zs_en_noprefix", "xl_prefix", "xl_noprefix", "instruct2")


@dataclass(frozen=True)
class Deviation:
    """One row: ``input`` is a literal text or ``vectors:NAME``; ``expect`` is what cosyclone gives."""

    number: int
    modes: tuple[str, ...]  # a mode (literal input) or the vector variants the row covers
    input: str
    official: str
    expect: list[str] | str  # the segments, "error: <substring>" or "prefix + zero_shot segments"

    @property
    def vector_name(self) -> str | None:
        return self.input.removeprefix("vectors:") if self.input.startswith("vectors:") else None


def _cells(line: str) -> list[str]:
    """Cells of a markdown table row; ``\\|`` is a literal pipe (inside code spans too)."""
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def _code(cell: str) -> str:
    m = re.fullmatch(r"`(.*)`", cell)
    assert m, f"expected a code span, got {cell!r}"
    return m.group(1)


def deviations() -> list[Deviation]:
    """Every row of the table under ``## Deviations``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Deviations", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if re.match(r"\|\s*\d+\s*\|", ln)]
    out = []
    for ln in rows:
        number, modes, given, official, cosyclone, _why = _cells(ln)
        given = _code(given)
        raw = _code(cosyclone)
        expect: list[str] | str = raw if raw.startswith(("error:", "prefix + ")) else json.loads(raw)
        out.append(Deviation(number=int(number), modes=tuple(m.strip() for m in modes.split(",")),
                             input=given if given.startswith("vectors:") else json.loads(given),
                             official=official, expect=expect))
    return out
