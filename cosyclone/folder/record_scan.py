"""Where each row's current record lies in a run folder, found in one streaming pass, in memory that
grows by a few bytes a row (:class:`RecordIndex`).

Why beside the SQLite index: ``export`` reads every row of a folder of any size, often one it must not
write into, so it builds this index aside, in memory; records are never held, only where they lie. One
pass over ``diagnostics.jsonl`` and every journal (the sources :func:`cosyclone.folder.layout.record_sources`
reads, in its order) notes per line a 128-bit hash of the id, ``finished_at``, the source and byte
offset, the manifest line, whether it says ``ok`` and its sample rate: 46 bytes a line in flat arrays
(about twice that for a moment while they are sorted). The current record of an id is its latest
``finished_at``, a later line winning a tie (the same rule as the folder's index); it is read again from
its offset when its row is exported.

Why a hash and not the id: a million ids as Python strings in a dict cost about 300 MB; the hash
costs 16 bytes, and two ids share one with probability about n^2 / 2^129 (1e-27 for a million).

Lines are split at ``\\n`` only: a record is one JSON line, and a text holding U+2028 (which
``json.dumps(ensure_ascii=False)`` leaves as it is) stays inside its line.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import MODEL_RATE
from cosyclone.folder.columns import MetaKeys
from cosyclone.folder.record_line import RecordLine, parse_record, why_not_a_record
from cosyclone.folder.row_record import RowRecord


def id_hash(row_id: str) -> tuple[int, int]:
    """The 128-bit blake2b of an id as two unsigned 64-bit halves."""
    digest = hashlib.blake2b(row_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def open_sources(paths: list[Path]) -> list[BinaryIO]:
    """The files of ``paths`` that exist, opened once for both passes.

    Held open so that a run finishing meanwhile cannot pull a record from under an export: its
    compaction renames a new ``diagnostics.jsonl`` over the old and unlinks its journal, and the
    open files still read the bytes the index was made from (journals are only appended to).
    """
    files: list[BinaryIO] = []
    for path in paths:
        try:
            files.append(open(path, "rb"))  # noqa: SIM115 (closed by the index's close())
        except FileNotFoundError:
            continue
    return files


def iter_records(fh: BinaryIO, corrupt: list[str] | None = None) -> Iterator[tuple[int, RecordLine]]:
    """(byte offset, record) of each line of an open records file that is a row's record
    (:func:`~cosyclone.folder.record_line.parse_record` decides which are), streamed; a torn last line is
    skipped, any other line that is not a record named in ``corrupt`` (file, line, byte offset)."""
    fh.seek(0)
    offset = 0
    for number, raw in enumerate(fh, 1):
        here, offset = offset, offset + len(raw)
        rec = parse_record(raw)
        if rec is not None:
            yield here, rec
        elif corrupt is not None and raw.endswith(b"\n") and raw.strip():
            why = why_not_a_record(raw)
            corrupt.append(f"{getattr(fh, 'name', '?')} line {number} (byte {here}): {why}, not a record")


def record_at(fh: BinaryIO, offset: int) -> RecordLine:
    """The record of the line at ``offset`` (indexed before, so it is one)."""
    fh.seek(offset)
    rec = parse_record(fh.readline())
    assert rec is not None
    return rec


def append_hash(row_id: str, hi: array[int], lo: array[int]) -> None:
    """Append an id's hash to the index arrays: the one way every index of a folder keys a line."""
    h = id_hash(row_id)
    hi.append(h[0])
    lo.append(h[1])


class RecordIndex:
    """The current record of every row of a folder: which are ``ok``, in manifest order, and their rates.

    ``meta_keys`` (when given) sees every line's ``meta`` as the pass goes by: the flat keys an
    export makes columns are known before its first shard fixes the schema.
    """

    def __init__(self, out_dir: Path, meta_keys: MetaKeys | None = None) -> None:
        out_dir = Path(out_dir)
        self.files = open_sources([out_dir / runfolder.DIAG_NAME,
                                   *sorted(runfolder.state_dir(out_dir).glob("journal-*.jsonl"))])
        hi, lo, src, off, line = array("Q"), array("Q"), array("H"), array("q"), array("q")
        finished, rate = array("d"), array("i")  # rate 0: the line is not an ok record
        self.corrupt: list[str] = []  # the lines that are not records, each named by file, line and byte
        for s, fh in enumerate(self.files):
            for offset, rec in iter_records(fh, self.corrupt):
                append_hash(rec.id, hi, lo)
                off.append(offset)
                src.append(s)
                line.append(rec.line)
                finished.append(rec.finished_at)
                rate.append((rec.sample_rate or MODEL_RATE) if rec.ok else 0)
                if meta_keys is not None:
                    meta_keys.add(rec.obj.get("meta"))
        self.lines_read = len(hi)
        h_hi, h_lo = np.frombuffer(hi, np.uint64), np.frombuffer(lo, np.uint64)
        arrival = np.arange(len(hi))
        order = np.lexsort((arrival, np.frombuffer(finished, np.float64), h_lo, h_hi))  # last key sorts first
        last = np.ones(order.size, dtype=bool)  # the last line of each id in that order is its current one
        last[:-1] = (h_hi[order][1:] != h_hi[order][:-1]) | (h_lo[order][1:] != h_lo[order][:-1])
        current = order[last]
        self.rows = int(current.size)  # rows with a record, whatever it says
        rates = np.frombuffer(rate, np.int32)[current]
        ok = current[rates > 0]
        lines = np.frombuffer(line, np.int64)[ok]
        ok = ok[np.lexsort((h_lo[ok], h_hi[ok], lines))]  # manifest line, ties by the id's hash (fixed)
        sources, offsets = np.frombuffer(src, np.uint16), np.frombuffer(off, np.int64)
        self.source = sources[ok].copy()
        self.offset = offsets[ok].copy()
        self.rate = np.frombuffer(rate, np.int32)[ok].copy()
        self.hash = np.stack([h_hi[ok], h_lo[ok]], axis=1)  # (ok rows, 2): the ids' hashes, for duplicates
        failed = current[rates == 0]
        failed = failed[np.argsort(np.frombuffer(line, np.int64)[failed], kind="stable")]
        self._failed = (sources[failed].copy(), offsets[failed].copy())

    @property
    def ok_rows(self) -> int:
        return int(self.offset.size)

    def rates(self) -> dict[int, int]:
        """Sample rate -> ok rows recorded at it."""
        values, counts = np.unique(self.rate, return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts, strict=True)}

    def records(self) -> Iterator[tuple[RowRecord, Mapping[str, Any]]]:
        """The current ``ok`` records, manifest order, read one at a time (as the folder reads them),
        each with its line as written (fields this cosyclone does not type are read from it)."""
        for start in range(0, self.offset.size, 4096):  # Python ints a chunk at a time, not a list per row
            chunk = slice(start, start + 4096)
            for s, o in zip(self.source[chunk].tolist(), self.offset[chunk].tolist(), strict=True):
                line = record_at(self.files[s], o)
                rec = RowRecord.from_json(line)
                if rec is not None:
                    yield rec, line.obj

    def record_at(self, position: int) -> RowRecord | None:
        """The ok record at ``position`` of the manifest order."""
        return RowRecord.from_json(
            record_at(self.files[int(self.source[position])], int(self.offset[position]))
        )

    def failed(self) -> Iterator[tuple[str, str]]:
        """(id, reason) of every row whose current record is not ok, manifest order."""
        for s, o in zip(self._failed[0].tolist(), self._failed[1].tolist(), strict=True):
            rec = record_at(self.files[s], o)
            yield rec.id, str(rec.obj.get("reason") or rec.status or "failed")

    def close(self) -> None:
        for fh in self.files:
            fh.close()
