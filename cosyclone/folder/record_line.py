"""A line of a records file (``diagnostics.jsonl``, a journal) read as a row's record, by one rule.

Why one function: the typed record (:meth:`cosyclone.folder.row_record.RowRecord.from_json`), the index
(:func:`cosyclone.folder.index_rows.row_values`), a run's end (:mod:`cosyclone.folder.settle`) and
export's index of a folder of any size all key on the same few fields; read by one rule here, a line
that one of them takes as a row's record is one that every other takes, with the same id, status, file,
manifest line and commit time.

The rule is tolerant, as a folder's memory must be: a line is data written by some version of cosyclone
(or torn by a kill), or received from someone else. A line that is not a JSON object with a string
``id`` the manifest would take (:func:`cosyclone.manifest.rows.check_id`: ids become file names) is not
a record (:func:`why_not_a_record` says which). The fields
every reader keys on are read as their type or their default (a count that is not an int reads None, a
time that is not a finite number 0.0); the object as written stays beside them, so a reader takes any
other field (and fields a newer cosyclone added) from it. Lines end at ``\\n`` only: a text holding
U+2028 (which ``json.dumps(ensure_ascii=False)`` leaves as it is) stays inside its line.

The shapes of lines earlier versions wrote, all still read: a ``wav`` path and no ``file`` nor
``audio_format`` (before FLAC; the file is a WAV), flat ``wavs/<id>.wav`` files (before the
``wavs/<shard>/`` directories), no ``line``, ``finished_at``, ``samples`` or ``sample_rate`` (read as
0, 0.0, None, None), no ``status`` (failed).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosyclone.manifest.rows import check_id


@dataclass(frozen=True, slots=True)
class RecordLine:
    """A records-file line that is a row's record: the fields every reader keys on, read by the one
    rule, and the object as written (every other field is read from it)."""

    id: str  # the row's id
    status: str  # ok | failed (a line whose status is not a string: failed)
    file: str | None  # its audio file relative to the folder (an older line's ``wav``); None: no file
    audio_format: str | None  # wav | flac (an older line with a file and no format: wav); None: no file
    line: int  # its manifest line (0: the line does not say)
    finished_at: float  # when it was committed, Unix time (0.0: the line does not say)
    samples: int | None  # samples its file holds, as recorded (None: not said)
    sample_rate: int | None  # its file's rate, as recorded (None: not said)
    fingerprint: str | None  # its fingerprint (None: it failed before one, or the line does not say)
    obj: Mapping[str, Any]  # the line's JSON object as written

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def parse_record(line: bytes | str | Mapping[str, Any]) -> RecordLine | None:
    """The record a records-file line holds (raw bytes or text of one line, or its object already
    decoded, as the writer holds it); None when it is not a row's record (torn, not an object, no
    string ``id``)."""
    if isinstance(line, Mapping):
        obj: Any = line
    else:
        try:
            obj = json.loads(line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
    rid = obj.get("id")
    if not isinstance(rid, str) or check_id(rid) is not None:  # ids become paths: the manifest's rule
        return None
    status = obj.get("status")
    file = obj.get("file") or obj.get("wav")  # written before audio formats: the WAV's path
    file = str(file) if file else None
    fmt = obj.get("audio_format")
    fp = obj.get("fingerprint")
    return RecordLine(
        id=rid,
        status=status if isinstance(status, str) else "failed",
        file=file,
        audio_format=(str(fmt) if fmt else "wav") if file is not None else (str(fmt) if fmt else None),
        line=_int(obj.get("line")) or 0,
        finished_at=_finite(obj.get("finished_at")),
        samples=_int(obj.get("samples")),
        sample_rate=_int(obj.get("sample_rate")),
        fingerprint=fp if isinstance(fp, str) else None,
        obj=obj,
    )


def why_not_a_record(line: bytes | str) -> str:
    """Why a line :func:`parse_record` refused is not a record: ``not JSON`` or ``no valid id``."""
    try:
        json.loads(line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line)
    except json.JSONDecodeError:
        return "not JSON"
    return "no valid id"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finite(value: Any) -> float:
    """``value`` as a finite float, else 0.0 (a record is data: it may say anything)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


# a record's top-level "fingerprint_parts" object, flat (a quote inside a text is escaped, so no text matches)
_PARTS = re.compile(r'"fingerprint_parts": (\{[^{}]*\})')


def fingerprint_parts(line: str) -> dict[str, str] | None:
    """A record line's ``fingerprint_parts`` read without parsing the rest (a plan of a million changed
    rows reads a million of them); a line not written as cosyclone writes it is read whole."""
    m = _PARTS.search(line)
    try:
        parts = json.loads(m.group(1)) if m is not None else None
    except json.JSONDecodeError:
        parts = None
    if parts is None:
        rec = parse_record(line)
        parts = rec.obj.get("fingerprint_parts") if rec is not None else None
    return parts if isinstance(parts, dict) else None
