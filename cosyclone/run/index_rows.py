"""What the folder index keeps of a record line: its columns, and its share of the folder totals.

Why its own module: the totals are one sum whoever adds them up, the index as rows are written or
``report``/``summary.json`` over records given one by one, so the reading of a record line
(:func:`row_values`) and a row's share of the totals (:func:`add_share`) are written once, here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyclone.manifest.rows import check_id

AUDIO_SCALE = 2**40  # audio seconds are summed as integers of 2^-40 s (exact in any order)

#: sampler counter -> (calls total name, rows total name), as report.py reads them
SAMPLER_COUNTERS: dict[str, tuple[str, str | None]] = {
    "steps": ("sampler_calls", None),
    "nan_steps": ("calls_with_nan", "rows_with_nan"),
    "all_nan_steps": ("calls_all_nan", "rows_all_nan"),
    "posinf_steps": ("calls_posinf", "rows_posinf"),
    "no_finite_steps": ("calls_no_finite", "rows_no_finite"),
    "ras_fallbacks": ("ras_fallbacks", "rows_ras_fallback"),
    "ras_sole_restores": ("ras_sole_restores", None),
}
_COUNTERS = tuple(SAMPLER_COUNTERS)
#: an ok row's file properties counted by value (share column, record field): a folder is one dataset
#: when each holds one value among its ok rows
FILE_SHARES = (("f_rate", "sample_rate"), ("f_format", "audio_format"), ("f_encoding", "encoding"))
#: where every row ran, counted by value (share column, record field): shown as a mix, never a redo
RAN_SHARES = (("r_device", "device"), ("r_threads", "threads"))
#: share columns the index declares TEXT (the others are integer sums)
TEXT_SHARES = ("reason", *(c for c, _ in FILE_SHARES), *(c for c, _ in RAN_SHARES), "r_run")
SHARE_COLUMNS = ("audio_fx", "nonfinite", "reason", *(c for c, _ in FILE_SHARES), *(c for c, _ in RAN_SHARES),
                 "r_run", *(f"c_{c}" for c in _COUNTERS))  # a row's share of the totals
COLUMNS = ("id", "fingerprint", "status", "file", "meta_dir", "samples", "sample_rate", "line", "finished_at",
            "src", "offset", *SHARE_COLUMNS)


@dataclass(frozen=True)
class IndexedRow:
    """What the index holds of one row's current record (the record itself: :meth:`FolderIndex.record`)."""

    id: str  # the row's id
    fingerprint: str | None  # its fingerprint (None: it failed before one)
    status: str  # ok | failed
    file: str | None  # its audio file relative to the folder (None: no file)
    samples: int | None  # samples its file holds, as recorded
    sample_rate: int | None  # its file's rate, as recorded
    line: int  # its manifest line
    finished_at: float  # when its record was committed
    src: str  # the records file holding it, relative to the folder
    offset: int  # the byte offset of its line there

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _int(value: Any) -> int:
    """A record's count as an int (a record is data: anything else counts 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if x == x and abs(x) != float("inf") else 0.0


def meta_dir(file: str | None) -> str | None:
    """The directory whose ``metadata.jsonl`` lists an audio file: its own for ``wavs/<shard>/<id>``,
    the folder's root (``""``) for a flat ``wavs/<id>`` of an earlier version."""
    if not file:
        return None
    parent = os.path.dirname(file)
    return "" if parent in ("", "wavs") else parent


def row_values(obj: Mapping[str, Any], src: str, offset: int) -> tuple[Any, ...] | None:
    """The index row of a record line's object (columns in :data:`COLUMNS` order); None: not a record."""
    rid = obj.get("id")
    if not isinstance(rid, str) or check_id(rid) is not None:  # ids become paths: the manifest's rule
        return None
    status = obj.get("status") if isinstance(obj.get("status"), str) else "failed"
    ok = status == "ok"
    file = obj.get("file") or obj.get("wav")
    file = str(file) if file else None
    sampler = obj.get("sampler")
    segs = [s for s in sampler if isinstance(s, dict)] if isinstance(sampler, list) else []
    counts = [sum(_int(s.get(c)) for s in segs) for c in _COUNTERS]
    audio = round(file_seconds(obj) * AUDIO_SCALE) if ok else 0
    reason = None if ok else str(obj.get("reason") or "unknown")
    props = {**obj, "audio_format": obj.get("audio_format") or ("wav" if file else None)}  # older lines: WAVs
    files = [str(props.get(field)) if ok else None for _, field in FILE_SHARES]
    ran = [None if obj.get(field) is None else str(obj.get(field)) for _, field in RAN_SHARES]
    run = obj.get("run_id")
    fp = obj.get("fingerprint")
    line = obj.get("line")
    return (rid, fp if isinstance(fp, str) else None, status, file, meta_dir(file) if ok else None,
            obj.get("samples") if isinstance(obj.get("samples"), int) else None,
            obj.get("sample_rate") if isinstance(obj.get("sample_rate"), int) else None,
            line if isinstance(line, int) else 0, _float(obj.get("finished_at")), src, offset,
            audio, _int(obj.get("nonfinite_audio_samples")), reason, *files, *ran,
            run if isinstance(run, str) else None, *counts)


def file_seconds(obj: Mapping[str, Any]) -> float:
    """The seconds of a record's audio file (samples / sample_rate, after --trim-silence), as every
    figure and export counts them; its ``audio_seconds`` when the record does not say both."""
    samples, rate = _int(obj.get("samples")), _int(obj.get("sample_rate"))
    return samples / float(rate) if samples and rate else _float(obj.get("audio_seconds"))


def share_ddl() -> list[str]:
    """The CREATE declarations of the share columns after ``reason`` (TEXT for :data:`TEXT_SHARES`)."""
    return [f"{c} TEXT" if c in TEXT_SHARES else f"{c} INTEGER NOT NULL DEFAULT 0" for c in SHARE_COLUMNS
            if c != "reason"]


def share_of(values: Sequence[Any]) -> Sequence[Any]:
    """A row's share of the totals (columns of :data:`SHARE_COLUMNS`) from its :func:`row_values`."""
    return values[len(COLUMNS) - len(SHARE_COLUMNS):]


def add_share(delta: dict[str, int], share: Sequence[Any], sign: int) -> None:
    """Add ``sign`` times a row's share to the kept totals ``delta`` (keys as :meth:`FolderIndex.totals`)."""
    audio, nonfinite, reason, *rest = share
    keys = {
        "rows": 1,
        "done": 1 if reason is None else 0,
        "audio_fx": audio,
        "nonfinite_audio_samples": nonfinite,
        "nonfinite_audio_rows": 1 if nonfinite else 0,
    }
    if reason is not None:
        keys[f"reason:{reason}"] = 1
    n_file, n_ran = len(FILE_SHARES), len(RAN_SHARES)
    files, ran, run, counts = (
        rest[:n_file],
        rest[n_file : n_file + n_ran],
        rest[n_file + n_ran],
        rest[n_file + n_ran + 1 :],
    )
    for (_, field), value in zip(FILE_SHARES, files, strict=True):
        if value is not None:
            keys[f"file:{field}:{value}"] = 1
    for (_, field), value in zip(RAN_SHARES, ran, strict=True):
        if value is not None:
            keys[f"ran:{field}:{value}"] = 1
    if run is not None:
        keys[f"run:{run}"] = 1
    for counter, n in zip(_COUNTERS, counts, strict=True):
        calls, rows = SAMPLER_COUNTERS[counter]
        keys[f"sampler:{calls}"] = n
        if rows:
            keys[f"sampler:{rows}"] = 1 if n else 0
    for k, v in keys.items():
        if v:
            delta[k] = delta.get(k, 0) + sign * v
