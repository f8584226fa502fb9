"""The pages a user reads (README.md and docs/*.md), parsed once for the doc tests (tests/docs/).

A fenced block in ``bash``, ``sh``, ``shell`` or ``python`` is run by tests/docs/test_doc_blocks.py
as written, unless the line right above its fence is a marker:

* ``<!-- doc-test skip: REASON -->``: not run (a GPU, a Ray cluster, a download, the released
  model); the reason is required and shown in the test report;
* ``<!-- doc-test replace OLD=NEW ... -->``: those literal substitutions first (each OLD must occur
  in the block; quote a pair holding spaces: ``"a b=c d"``), e.g. the released model's path to the
  tiny model, ``me.wav`` to a prompt of ``manifests/``;
* ``<!-- doc-test -->``: run as written (the same as no marker).

``<!-- readme-test ... -->`` is an older spelling of ``doc-test`` and is read the same way.
Every other kind of block (``json``, ``text``, none) is shown, never run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ("bash", "sh", "shell", "python")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^<!--\s*(?:doc|readme)-test\b(?P<args>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, as the doc tests run it."""

    page: str  # "README.md" or "docs/NAME.md"
    line: int  # 1-based line of its opening fence
    lang: str
    source: str  # the body as the page shows it
    skip: str | None = None  # why it is not run (the skip marker's reason)
    replace: tuple[tuple[str, str], ...] = field(default=())  # the marker's (old, new) pairs, in order

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE and self.skip is None

    def body(self) -> str:
        """The block with its marker's substitutions made (an OLD the block lacks fails, named)."""
        text = self.source
        for old, new in self.replace:
            assert old in text, f"{self.where}: the marker replaces {old!r}, which the block does not contain"
            text = text.replace(old, new)
        return text


def pages() -> dict[str, str]:
    """Every page a user reads: the README first, then docs/ by name."""
    out = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    for path in sorted((ROOT / "docs").glob("*.md")):
        out[f"docs/{path.name}"] = path.read_text(encoding="utf-8")
    return out


def blocks(page: str, text: str) -> list[Block]:
    """The fenced blocks of one page with their markers read (a bad marker raises, naming its line)."""
    out = []
    lines = text.splitlines()
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        above = lines[line - 2].strip() if line >= 2 else ""
        skip: str | None = None
        replace: tuple[tuple[str, str], ...] = ()
        marker = MARKER.match(above)
        if marker:
            skip, replace = _marker(f"{page}:{line - 1}", marker.group("args").strip())
        elif above.startswith("<!--") and "test" in above:
            raise AssertionError(f"{page}:{line - 1}: unknown marker {above!r}; write <!-- doc-test skip: "
                                 "REASON --> or <!-- doc-test replace OLD=NEW -->")
        out.append(Block(page, line, m.group("lang"), m.group("body"), skip, replace))
    return out


def _marker(where: str, args: str) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    if not args:
        return None, ()
    if args.startswith("skip"):
        reason = args[len("skip"):].lstrip(":").strip()
        assert reason, f"{where}: a skip marker says why: <!-- doc-test skip: REASON -->"
        return reason, ()
    words = shlex.split(args)
    assert words[0] == "replace" and len(words) > 1, (
        f"{where}: unknown doc-test marker arguments {args!r}; write skip: REASON or replace OLD=NEW ...")
    pairs = []
    for pair in words[1:]:
        assert "=" in pair, f"{where}: {pair!r} is not OLD=NEW"
        old, new = pair.split("=", 1)
        pairs.append((old, new))
    return None, tuple(pairs)


def all_blocks() -> list[Block]:
    return [b for page, text in pages().items() for b in blocks(page, text)]


def prose(text: str) -> str:
    """The page without its fenced blocks and HTML comments (what the name checks read)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
