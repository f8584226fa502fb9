"""A run's rows against the folder: which are done, which are made again, and why.

A row is skipped when the folder's index has an ``ok`` record of it whose audio file holds the
recorded samples and whose inputs are the ones the current run gives (the same fingerprint, or the
same parts of it that the user chose: where a row ran never redoes it); anything else is
made again, and a row that was complete but changed is counted by the fingerprint parts that
changed. Only the manifest's own rows are looked up (:meth:`~cosyclone.folder.index.FolderIndex.get_many`),
so planning a few rows against a folder of millions costs a few rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cosyclone.folder.fingerprint import changed_parts, same_inputs
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.layout import is_complete

if TYPE_CHECKING:  # annotations only: planning against a folder loads neither torch nor the frontend
    from cosyclone.manifest import ManifestRow


@dataclass
class ResumePlan:
    """What a run must do with the manifest rows, against the folder's records."""

    todo: list[ManifestRow]  # rows to synthesize (new, changed, failed before, or incomplete)
    done: list[str]  # ids skipped: complete and fingerprint unchanged
    redone: dict[str, list[str]]  # id -> changed fingerprint parts (rows that were complete)
    retried: list[str]  # ids whose earlier attempt failed or whose WAV is missing/torn
    foreign: int = 0  # rows in the folder that this manifest does not have (kept)

    def redone_counts(self) -> dict[str, int]:
        """Changed part -> rows ("text 3, seed 9"); a row changed in two parts counts in both."""
        counts: dict[str, int] = {}
        for parts in self.redone.values():
            for p in parts:
                counts[p] = counts.get(p, 0) + 1
        return counts

    def describe(self) -> str:
        bits = []
        if self.redone:
            counts = ", ".join(
                f"{k} {v}" for k, v in sorted(self.redone_counts().items(), key=lambda kv: -kv[1])
            )
            bits.append(f"{len(self.redone)} rows redone: {counts}")
        if self.retried:
            bits.append(f"{len(self.retried)} rows retried (failed or incomplete before)")
        if self.foreign:
            bits.append(f"{self.foreign} rows in the folder are not in this manifest (kept)")
        return "; ".join(bits)


def plan_resume(
    out_dir: Path,
    rows: Iterable[ManifestRow],
    fingerprints: Mapping[str, tuple[str, dict[str, str]]],
    *,
    index: FolderIndex,
    overwrite: bool = False,
) -> ResumePlan:
    """Decide per row: skip (complete, same fingerprint) or redo, and why, against the folder's
    ``index`` (only these rows are looked up; a changed row's record is read for its fingerprint
    parts). Foreign rows (in the folder, not in the manifest) are the caller's to count: only it
    has seen every part."""
    rows = list(rows)
    found = {r.id: r for r in index.get_many(r.id for r in rows)}
    plan = ResumePlan(todo=[], done=[], redone={}, retried=[])
    for row in rows:
        rec = found.get(row.id)
        fp, parts = fingerprints[row.id]
        if rec is None:
            plan.todo.append(row)
            continue
        complete = is_complete(out_dir, rec)
        stored = None if rec.fingerprint == fp else index.fingerprint_parts(rec)  # read only when it differs
        same = rec.fingerprint == fp or same_inputs(rec.fingerprint, stored, fp, parts)
        if complete and not overwrite and same:
            plan.done.append(row.id)
            continue
        plan.todo.append(row)
        if not same and rec.ok:
            plan.redone[row.id] = changed_parts(stored, parts)
        elif overwrite and complete:
            plan.redone[row.id] = ["overwrite"]
        else:
            plan.retried.append(row.id)
    return plan
