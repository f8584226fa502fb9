"""Eval's line of each row, by id hash (:class:`EvalIndex`): what an export joins to a row's record.

Memory grows by a few bytes a line, as in :mod:`cosyclone.folder.record_scan` (whose id hash it keys
by); the line is read again from its offset when its row is exported.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from cosyclone.folder.record_scan import append_hash, id_hash, open_sources
from cosyclone.folder.scores import SCORES_NAME, scores_path
from cosyclone.manifest.rows import check_id

# written by `cosyclone eval` (cosyclone/eval/evaluate.py; older versions: eval.jsonl)
EVAL_NAME = SCORES_NAME


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


def read_at(fh: BinaryIO, offset: int) -> dict[str, Any]:
    """The JSON object of the eval line at ``offset`` (indexed before, so it parses)."""
    fh.seek(offset)
    obj = json.loads(fh.readline().decode("utf-8", errors="replace"))
    assert isinstance(obj, dict)
    return obj


def _keyed(lines: Iterator[tuple[int, dict[str, Any]]], hi: array[int], lo: array[int],
           off: array[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The eval lines that are a row's (a string ``id``), each one's id hash and offset appended to
    the index arrays as it passes."""
    for offset, obj in lines:
        rid = obj.get("id")
        if not isinstance(rid, str) or check_id(rid) is not None:  # an id the manifest would take
            continue
        append_hash(rid, hi, lo)
        off.append(offset)
        yield offset, obj


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
