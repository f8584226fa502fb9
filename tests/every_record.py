"""Every record of a run folder read the plain way, as the tests' measure of what the folder's index answers.

Why in the tests: the product finds a row's current record through the index alone
(:mod:`cosyclone.folder.current`); the tests hold this second, deliberately simple reader (every line
of ``diagnostics.jsonl`` and every journal, the latest ``finished_at`` winning, a later line a tie) to
check the index against.
"""

from __future__ import annotations

from pathlib import Path

from cosyclone.folder.layout import DIAG_NAME, iter_jsonl, state_dir
from cosyclone.folder.row_record import RowRecord


def read_records(out_dir: Path) -> dict[str, RowRecord]:
    """The current record per row id: ``diagnostics.jsonl`` and every journal, latest ``finished_at`` wins."""
    out_dir = Path(out_dir)
    sources = [out_dir / DIAG_NAME, *sorted(state_dir(out_dir).glob("journal-*.jsonl"))]
    found: dict[str, RowRecord] = {}
    for path in sources:
        for obj in iter_jsonl(path):
            try:
                rec = RowRecord.from_json(obj)
            except (TypeError, ValueError):  # a line no version of cosyclone wrote: not a record
                continue
            if rec is None:
                continue
            prev = found.get(rec.id)
            if prev is None or rec.finished_at >= prev.finished_at:
                found[rec.id] = rec
    return found
