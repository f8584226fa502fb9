"""The current record of a folder's rows, read through the index: the one way ``report``, ``eval`` and
``trace`` find what a row's latest record says.

Why through the index: the index already decides which line of the records files is a row's current
record (:mod:`cosyclone.folder.index`); a second reader with its own rules would drift from it. Where
the folder's own index cannot be opened (a read-only mount, another user's folder), one is built aside
in a temporary directory from the same records files, in one streaming pass, and removed after: reading
a folder never needs to write into it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from cosyclone.folder import layout as runfolder
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.index_rows import IndexedRow
from cosyclone.folder.row_record import RowRecord


@contextlib.contextmanager
def reading(out_dir: Path) -> Iterator[FolderIndex]:
    """The folder's index, up to date (brought so under the folder's settle lock), or one built aside
    when the folder cannot hold it; closed (and the aside one removed) on leaving."""
    out_dir = Path(out_dir)
    aside: tempfile.TemporaryDirectory[str] | None = None
    try:
        with runfolder.settle_lock(out_dir):
            index = runfolder.open_index(out_dir)
    except (OSError, sqlite3.Error, runfolder.OutputFolderError):  # this user cannot write the folder
        aside = tempfile.TemporaryDirectory(prefix="cosyclone-index-")
        index = FolderIndex(out_dir, runfolder.record_sources(out_dir), state=aside.name)
    try:
        yield index
    finally:
        index.close()
        if aside is not None:
            aside.cleanup()


def records_of(index: FolderIndex, rows: Iterable[IndexedRow]) -> Iterator[RowRecord]:
    """The records the indexed ``rows`` point at, read from their lines (a line gone since is left out)."""
    for row in rows:
        line = index.record(row)
        rec = RowRecord.from_json(line) if line is not None else None
        if rec is not None:
            yield rec


def current_records(out_dir: Path, ids: Iterable[str] | None = None) -> dict[str, RowRecord]:
    """The current record of each row (of ``ids`` only, when given: looked up, not a read of every
    record) the folder has. A folder with no records file yet gives none, and no index is made in it."""
    if not runfolder.record_sources(out_dir):
        return {}
    with reading(out_dir) as index:
        rows = index.rows() if ids is None else index.get_many(ids)
        return {rec.id: rec for rec in records_of(index, rows)}
