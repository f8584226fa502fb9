"""Totals of a run folder (``summary.json`` and ``cosyclone report``), from the totals its index keeps.

The totals depend only on the current record of each row, never on how many invocations made
them: one run, a run killed and resumed five times, or four shards merged give the same numbers.
The index (:mod:`cosyclone.run.index`) keeps them as rows are written, so reading them costs the
same for four rows or ten million. Sampler counts are "row-steps" as in
:mod:`cosyclone.talker.diagnostics`: a ``calls_*`` total sums a counter over every segment of every
row, a ``rows_*`` total counts rows where it was non-zero.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from cosyclone.run import folder as runfolder
from cosyclone.run.index import FolderIndex
from cosyclone.run.index_rows import (
    AUDIO_SCALE,
    SAMPLER_COUNTERS,
    SHARE_COLUMNS,
    add_share,
    row_values,
    share_of,
)
from cosyclone.run.row_record import RowRecord


def totals_of(kept: Mapping[str, int]) -> dict[str, Any]:
    """The folder totals as ``summary.json`` and ``report`` show them, from the index's kept totals."""
    sampler: dict[str, int] = {}
    for calls, flagged in SAMPLER_COUNTERS.values():
        sampler[calls] = kept.get(f"sampler:{calls}", 0)
        if flagged:
            sampler[flagged] = kept.get(f"sampler:{flagged}", 0)
    reasons = {k.removeprefix("reason:"): v for k, v in sorted(kept.items()) if k.startswith("reason:") and v}
    audio = float(Fraction(kept.get("audio_fx", 0), AUDIO_SCALE))
    rows, done = kept.get("rows", 0), kept.get("done", 0)
    return {
        "rows": rows, "done": done, "failed": rows - done, "failed_reasons": reasons,
        "audio_seconds": round(audio, 6), "sampler": sampler,
        "nan_summary": f"{sampler['sampler_calls']} sampler calls, {sampler['calls_all_nan']} entirely NaN",
        "nonfinite_audio_rows": kept.get("nonfinite_audio_rows", 0),
        "nonfinite_audio_samples": kept.get("nonfinite_audio_samples", 0),
    }


def folder_totals(records: Iterable[RowRecord]) -> dict[str, Any]:
    """Totals over row records given one by one (the same sums the index keeps)."""
    kept: dict[str, int] = {}
    for rec in records:
        values = row_values(rec.to_json(), "", 0)
        if values is not None:
            add_share(kept, share_of(values), +1)
    return totals_of(kept)


def open_read(folder: Path) -> FolderIndex:
    """A folder's index for reading its totals (brought up to date under the folder's settle lock)."""
    with runfolder.settle_lock(folder):
        return runfolder.open_index(folder)


def merged_totals(folders: Sequence[Path]) -> tuple[dict[str, Any], list[str]]:
    """The totals of several folders (shards) as one: (totals, warnings about ids in two folders).

    An id in two folders counts once, by its later attempt (``finished_at``; a tie goes to the folder
    named later); only the ids the folders share are read, each pair of folders joined in SQLite.
    """
    indexes = [open_read(f) for f in folders if runfolder.record_sources(f)]  # a folder without records adds 0
    folders = [f for f in folders if runfolder.record_sources(f)]
    try:
        kept: dict[str, int] = {}
        for idx in indexes:
            for k, v in idx.totals().items():
                kept[k] = kept.get(k, 0) + v
        warnings: list[str] = []
        for i, a in enumerate(indexes):
            losers: dict[str, Sequence[Any]] = {}
            for j, b in enumerate(indexes):
                if i == j:
                    continue
                for rid, mine, theirs, share in _shared(a, b):
                    if i < j:
                        warnings.append(f"row {rid!r} is in {folders[i]} and {folders[j]}: the later attempt counts")
                    if theirs > mine or (theirs == mine and j > i):
                        losers[rid] = share
            for share in losers.values():
                add_share(kept, share, -1)
        return totals_of(kept), warnings
    finally:
        for idx in indexes:
            idx.close()


def _shared(a: FolderIndex, b: FolderIndex) -> Iterable[tuple[str, float, float, Sequence[Any]]]:
    """(id, finished_at in a, finished_at in b, a's share) of every id both folders hold."""
    db = sqlite3.connect(a.path)
    try:
        db.execute("ATTACH DATABASE ? AS other", (str(b.path),))
        cols = ", ".join(f"r.{c}" for c in SHARE_COLUMNS)
        for row in db.execute(f"SELECT r.id, r.finished_at, o.finished_at, {cols} FROM main.rows r "
                              "JOIN other.rows o ON o.id = r.id"):
            yield row[0], row[1], row[2], row[3:]
    finally:
        db.close()


TABLE_ROWS = (("rows", "rows"), ("done", "done"), ("failed", "failed"), ("failed_reasons", "failed by reason"),
              ("audio_seconds", "audio s"), ("nan_summary", "sampler"))


def render(totals: Mapping[str, Any], *, title: str, tty: bool, extra: Mapping[str, Any] | None = None) -> None:
    """A rich table on a terminal; plain ``label: value`` lines otherwise (logs grep well)."""
    lines = [(label, _fmt(totals.get(key))) for key, label in TABLE_ROWS]
    lines += [(k.replace("_", " "), _fmt(v)) for k, v in totals.get("sampler", {}).items()
              if k != "sampler_calls" and v]
    if totals.get("nonfinite_audio_samples"):
        lines.append(("non-finite audio", f"{totals['nonfinite_audio_rows']} rows, "
                                           f"{totals['nonfinite_audio_samples']} samples"))
    lines += [(k, _fmt(v)) for k, v in (extra or {}).items()]
    if tty:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_header=False)
        for label, value in lines:
            table.add_row(label, value)
        Console().print(table)
    else:
        print(title)
        for label, value in lines:
            print(f"  {label}: {value}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return "" if value is None else str(value)
