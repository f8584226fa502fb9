"""Where each row's current record lies in a run folder, in memory that does not grow with the folder.

``export`` reads a folder of any size: its records are never held, only where they lie.
:class:`RecordIndex` asks the folder's index (:mod:`cosyclone.run.index`, SQLite) for the current
``ok`` rows in manifest order, streamed, and reads each record from its offset when its row is
exported. :class:`EvalIndex` keys ``eval.jsonl``'s lines by a 128-bit hash of the id with their
offsets, 24 bytes a line in flat arrays (the last line of an id wins).

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

from cosyclone.run import folder as runfolder
from cosyclone.run.audio_out import MODEL_RATE
from cosyclone.run.row_record import RowRecord

EVAL_NAME = "eval.jsonl"  # written by `cosyclone eval` (cosyclone/eval/evaluate.py)


def id_hash(row_id: str) -> tuple[int, int]:
    """The 128-bit blake2b of an id as two unsigned 64-bit halves."""
    digest = hashlib.blake2b(row_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def open_sources(paths: list[Path]) -> list[BinaryIO]:
    """The files of ``paths`` that exist, opened once for both passes.

    Held open so that a file replaced meanwhile cannot pull a line from under the reader: the open
    files still read the bytes the index was made from.
    """
    files: list[BinaryIO] = []
    for path in paths:
        try:
            files.append(open(path, "rb"))  # noqa: SIM115 (closed by the index's close())
        except FileNotFoundError:
            continue
    return files


def iter_lines(fh: BinaryIO) -> Iterator[tuple[int, dict[str, Any]]]:
    """(byte offset, object) of each JSON-object line of an open file, streamed; torn lines skipped."""
    fh.seek(0)
    offset = 0
    for raw in fh:
        here, offset = offset, offset + len(raw)
        try:
            obj = json.loads(raw.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield here, obj


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
    """The current record of every row of a folder: which are ``ok``, in manifest order, and their rates,
    as the folder's index (:mod:`cosyclone.run.index`) has them; a record is read when its row is."""

    def __init__(self, out_dir: Path) -> None:
        with runfolder.settle_lock(Path(out_dir)):
            self.index = runfolder.open_index(Path(out_dir))
        self.rows = self.index.count()  # rows with a record, whatever it says
        self.lines_read = self.rows
        self._rates = self.index.rates()

    @property
    def ok_rows(self) -> int:
        return sum(self._rates.values())

    def rates(self) -> dict[int, int]:
        """Sample rate -> ok rows recorded at it (none recorded: the model's)."""
        out: dict[int, int] = {}
        for rate, n in self._rates.items():
            out[rate or MODEL_RATE] = out.get(rate or MODEL_RATE, 0) + n
        return out

    def records(self) -> Iterator[RowRecord]:
        """The current ``ok`` records, manifest order, read one at a time (a run that ends meanwhile moves
        its journal's lines: such a row is looked up again)."""
        for row in self.index.ok_rows():
            obj = self.index.record(row)
            if obj is None:
                obj = next((self.index.record(r) for r in self.index.get_many([row.id])), None)
            rec = RowRecord.from_json(obj) if obj is not None else None
            if rec is not None and rec.ok:
                yield rec

    def close(self) -> None:
        self.index.close()


class EvalIndex:
    """``eval.jsonl`` by id hash (the last line of an id wins), and the speaker backends it scored."""

    def __init__(self, out_dir: Path) -> None:
        self.files = open_sources([Path(out_dir) / EVAL_NAME])
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
