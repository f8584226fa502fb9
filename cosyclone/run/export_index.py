"""Where each row's current record lies in a run folder, in memory that grows by a few bytes a row.

``export`` reads a folder of any size: its records are never held, only where they lie. One pass
over ``diagnostics.jsonl`` and every journal (the sources :func:`cosyclone.run.folder.read_records`
reads, in its order) notes per line a 128-bit hash of the id, ``finished_at``, the source and byte
offset, the manifest line, whether it says ``ok`` and its sample rate: 46 bytes a line in flat arrays
(about twice that for a moment while they are sorted). The
current record of an id is its latest ``finished_at``, a later line winning a tie (the same rule as
``read_records``); it is read again from its offset when its row is exported.

Why a hash and not the id: a million ids as Python strings in a dict cost about 300 MB; the hash
costs 16 bytes, and two ids share one with probability about n^2 / 2^129 (1e-27 for a million).

Lines are split at ``\\n`` only: a record is one JSON line, and a text holding U+2028 (which
``json.dumps(ensure_ascii=False)`` leaves as it is) stays inside its line.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from cosyclone.manifest.rows import check_id
from cosyclone.run import folder as runfolder
from cosyclone.run.audio_out import MODEL_RATE
from cosyclone.run.columns import MetaKeys
from cosyclone.run.row_record import RowRecord
from cosyclone.run.scores import SCORES_NAME, scores_path

# written by `cosyclone eval` (cosyclone/eval/evaluate.py; older versions: eval.jsonl)
EVAL_NAME = SCORES_NAME


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


def iter_lines(fh: BinaryIO, corrupt: list[str] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(byte offset, object) of each record line of an open file (an object with an id the manifest would
    take), streamed; a torn last line is skipped, any other line that is not a record named in ``corrupt``
    (file, line, byte offset)."""
    fh.seek(0)
    offset = 0
    for number, raw in enumerate(fh, 1):
        here, offset = offset, offset + len(raw)
        try:
            obj = json.loads(raw.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
            obj = None
        rid = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(obj, dict) and isinstance(rid, str) and check_id(rid) is None:
            yield here, obj
        elif corrupt is not None and raw.endswith(b"\n") and raw.strip():
            why = "not JSON" if obj is None else "no valid id"
            corrupt.append(f"{getattr(fh, 'name', '?')} line {number} (byte {here}): {why}, not a record")


def _number(value: Any, default: float) -> float:
    """``value`` as a finite float, else ``default`` (a record is data: it may say anything)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) else default


def read_at(fh: BinaryIO, offset: int) -> dict[str, Any]:
    """The JSON object of the line at ``offset`` (indexed before, so it parses)."""
    fh.seek(offset)
    obj = json.loads(fh.readline().decode("utf-8", errors="replace"))
    assert isinstance(obj, dict)
    return obj


def _keyed(lines: Iterator[tuple[int, dict[str, Any]]], hi: array[int], lo: array[int],
           off: array[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The lines that are a row's (a string ``id``), each one's id hash and offset appended to the
    index arrays as it passes: the one way both indexes key a line."""
    for offset, obj in lines:
        rid = obj.get("id")
        if not isinstance(rid, str):
            continue
        h = id_hash(rid)
        hi.append(h[0])
        lo.append(h[1])
        off.append(offset)
        yield offset, obj


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
            for _, obj in _keyed(iter_lines(fh, self.corrupt), hi, lo, off):
                src.append(s)
                line.append(int(_number(obj.get("line"), 0.0)))
                finished.append(_number(obj.get("finished_at"), 0.0))
                ok = obj.get("status") == "ok"
                rate.append(int(_number(obj.get("sample_rate"), MODEL_RATE)) if ok else 0)
                if meta_keys is not None:
                    meta_keys.add(obj.get("meta"))
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

    def records(self) -> Iterator[tuple[RowRecord, dict[str, Any]]]:
        """The current ``ok`` records, manifest order, read one at a time (as the folder reads them),
        each with its line as written (fields this cosyclone does not type are read from it)."""
        for start in range(0, self.offset.size, 4096):  # Python ints a chunk at a time, not a list per row
            chunk = slice(start, start + 4096)
            for s, o in zip(self.source[chunk].tolist(), self.offset[chunk].tolist(), strict=True):
                raw = read_at(self.files[s], o)
                rec = RowRecord.from_json(raw)
                if rec is not None:
                    yield rec, raw

    def record_at(self, position: int) -> RowRecord | None:
        """The ok record at ``position`` of the manifest order."""
        return RowRecord.from_json(
            read_at(self.files[int(self.source[position])], int(self.offset[position]))
        )

    def failed(self) -> Iterator[tuple[str, str]]:
        """(id, reason) of every row whose current record is not ok, manifest order."""
        for s, o in zip(self._failed[0].tolist(), self._failed[1].tolist(), strict=True):
            obj = read_at(self.files[s], o)
            yield str(obj.get("id")), str(obj.get("reason") or obj.get("status") or "failed")

    def close(self) -> None:
        for fh in self.files:
            fh.close()


class EvalIndex:
    """``scores.jsonl`` (an older folder's ``eval.jsonl``) by id hash (the last line of an id wins), and the
    speaker backends it scored."""

    def __init__(self, out_dir: Path) -> None:
        self.files = open_sources([scores_path(Path(out_dir))])
        hi, lo, off = array("Q"), array("Q"), array("q")
        backends: set[str] = set()
        for _, obj in _keyed((pair for fh in self.files for pair in iter_lines(fh)), hi, lo, off):
            sims = obj.get("speaker_similarity")
            if isinstance(sims, dict):
                backends.update(str(k) for k in sims)
        self.backends = tuple(sorted(backends))
        h_hi, h_lo = np.frombuffer(hi, np.uint64), np.frombuffer(lo, np.uint64)
        order = np.lexsort((np.arange(len(hi)), h_lo, h_hi))
        last = np.ones(order.size, dtype=bool)
        last[:-1] = (h_hi[order][1:] != h_hi[order][:-1]) | (h_lo[order][1:] != h_lo[order][:-1])
        keep = order[last]
        self._hi, self._lo = h_hi[keep].copy(), h_lo[keep].copy()
        self._off = np.frombuffer(off, np.int64)[keep].copy()

    def get(self, row_id: str) -> dict[str, Any] | None:
        """The row's eval record, None when eval wrote none for it."""
        h_hi, h_lo = id_hash(row_id)
        i = int(np.searchsorted(self._hi, np.uint64(h_hi)))
        while i < self._hi.size and int(self._hi[i]) == h_hi:
            if int(self._lo[i]) == h_lo:
                return read_at(self.files[0], int(self._off[i]))
            i += 1
        return None

    def close(self) -> None:
        for fh in self.files:
            fh.close()
