"""The index's reads: a folder's kept totals, its rows by id, streamed, by metadata directory, and the
record line a row points at (:class:`cosyclone.folder.index.FolderIndex` adds opening and writing).

Why apart: a run, ``report``, ``eval`` and ``export`` read a folder many ways, and each read is a
bounded query (a batch of ids, a page of rows) so its memory is the query's, not the folder's.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from cosyclone.folder.index_rows import IndexedRow
from cosyclone.folder.record_line import RecordLine, fingerprint_parts, parse_record

BATCH = 500  # ids per lookup query (SQLite allows 999 parameters on old builds)
PAGE = 4096  # rows per query of a streamed read
_BRIEF = "id, fingerprint, status, file, samples, sample_rate, line, finished_at, src, offset"


class IndexReads:
    """The queries of an open index (the connection, its lock and the open record files are the
    index's own)."""

    out_dir: Path  # the run folder
    db: sqlite3.Connection  # the open index
    _lock: threading.RLock  # one query at a time: the index is shared by a run's threads
    _files: dict[str, BinaryIO]  # record files read by record(), kept open until close()

    def totals(self) -> dict[str, int]:
        """The kept totals: ``rows``, ``done``, ``audio_fx``, ``reason:<r>``, ``sampler:<name>``, ... ."""
        with self._lock:
            return {k: int(v) for k, v in self.db.execute("SELECT key, value FROM totals")}

    def corrupt_lines(self) -> list[str]:
        """Each whole line of the records files that is not a record, named by file, line and byte offset
        (the line's number counted from the file's start: only read when there is such a line)."""
        with self._lock:
            found = self.db.execute("SELECT src, offset, why FROM corrupt ORDER BY src, offset").fetchall()
        return [f"{self.out_dir / src} line {line_number(self.out_dir / src, off)} (byte {off}): {why}, "
                "not a record; that row is left out until it is fixed" for src, off, why in found]

    def count(self) -> int:
        with self._lock:
            return int(self.db.execute("SELECT count(*) FROM rows").fetchone()[0])

    def get_many(self, ids: Iterable[str]) -> Iterator[IndexedRow]:
        """The indexed rows of ``ids`` that the folder has (any order), queried a batch at a time."""
        it = iter(ids)
        while True:
            chunk = [rid for _, rid in zip(range(BATCH), it, strict=False)]
            if not chunk:
                return
            with self._lock:
                found = self.db.execute(
                    f"SELECT {_BRIEF} FROM rows WHERE id IN ({', '.join('?' * len(chunk))})", chunk
                ).fetchall()
            yield from (IndexedRow(*r) for r in found)

    def count_present(self, ids: Iterable[str]) -> int:
        """How many of ``ids`` (distinct) the folder has a row of, counted a batch at a time."""
        it, n = iter(ids), 0
        while chunk := [rid for _, rid in zip(range(BATCH), it, strict=False)]:
            with self._lock:
                n += int(
                    self.db.execute(
                        f"SELECT count(*) FROM rows WHERE id IN ({', '.join('?' * len(chunk))})", chunk
                    ).fetchone()[0]
                )
        return n

    def ids(self) -> Iterator[str]:
        """Every row id of the folder, streamed in id order (a page of ids per query)."""
        last = ""
        while True:
            with self._lock:
                page = [r[0] for r in self.db.execute("SELECT id FROM rows WHERE id > ? ORDER BY id LIMIT ?",
                                                      (last, PAGE))]
            yield from page
            if len(page) < PAGE:
                return
            last = page[-1]

    def rows(self) -> Iterator[IndexedRow]:
        """Every row of the folder whatever its current record says, streamed in id order (a page per
        query)."""
        last = ""
        while True:
            with self._lock:
                page = [IndexedRow(*r) for r in self.db.execute(
                    f"SELECT {_BRIEF} FROM rows WHERE id > ? ORDER BY id LIMIT ?", (last, PAGE))]
            yield from page
            if len(page) < PAGE:
                return
            last = page[-1].id

    def ok_rows(self) -> Iterator[IndexedRow]:
        """The current ``ok`` rows in manifest-line order (ties by id), streamed a page per query."""
        line, last = -(2**62), ""
        while True:
            with self._lock:
                page = [IndexedRow(*r) for r in self.db.execute(
                    f"SELECT {_BRIEF} FROM rows WHERE status = 'ok' AND (line > ? OR (line = ? AND id > ?)) "
                    "ORDER BY line, id LIMIT ?", (line, line, last, PAGE))]
            yield from page
            if len(page) < PAGE:
                return
            line, last = page[-1].line, page[-1].id

    def in_dir(self, directory: str) -> list[IndexedRow]:
        """The ``ok`` rows whose audio file ``directory``'s ``metadata.jsonl`` lists, line order (a
        directory holds a few thousand rows at ten million)."""
        with self._lock:
            return [IndexedRow(*r) for r in self.db.execute(
                f"SELECT {_BRIEF} FROM rows WHERE meta_dir = ? ORDER BY line, id", (directory,))]

    def fingerprint_parts(self, row: IndexedRow) -> dict[str, str] | None:
        """The ``fingerprint_parts`` of the record an indexed row points at, read from its line without
        parsing the rest (:func:`~cosyclone.folder.record_line.fingerprint_parts`); None: none."""
        raw = self._line(row)
        return fingerprint_parts(raw) if raw is not None else None

    def _line(self, row: IndexedRow) -> str | None:
        try:
            fh = self._files.get(row.src)
            if fh is None:
                fh = self._files[row.src] = open(self.out_dir / row.src, "rb")  # noqa: SIM115 (closed by close())
            with self._lock:
                fh.seek(row.offset)
                return fh.readline().decode("utf-8", errors="replace")
        except OSError:
            return None

    def record(self, row: IndexedRow) -> RecordLine | None:
        """The record line an indexed row points at, read (None: the file no longer holds it). The
        record files stay open until :meth:`close` (a plan reads many, in file order)."""
        raw = self._line(row)
        rec = parse_record(raw) if raw is not None else None
        return rec if rec is not None and rec.id == row.id else None


def line_number(path: Path, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` (newlines before it, plus one)."""
    n, left = 1, offset
    try:
        with open(path, "rb") as fh:
            while left > 0:
                block = fh.read(min(left, 1 << 20))
                if not block:
                    break
                n += block.count(b"\n")
                left -= len(block)
    except OSError:
        return 0
    return n
