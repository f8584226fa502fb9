"""One rule reads a record line: every shape of line a folder may hold (written by this cosyclone, by an
earlier one, torn by a kill, or foreign) is fed to :func:`parse_record`, and every reader of a folder
(the typed record, the index, the whole-folder read, export's index, a run's end) takes the same lines
as records, with the same id, status, file, manifest line and commit time."""

from __future__ import annotations

import json
from pathlib import Path

from cosyclone.folder import layout as runfolder
from cosyclone.folder.index_rows import COLUMNS, row_values
from cosyclone.folder.record_line import RecordLine, fingerprint_parts, parse_record, why_not_a_record
from cosyclone.folder.record_scan import RecordIndex
from cosyclone.folder.row_record import RowRecord
from tests.every_record import read_records

KEYED = ("id", "status", "file", "audio_format", "line", "finished_at", "samples", "sample_rate",
         "fingerprint")

#: (line as written, what parse_record reads from it: the keyed fields, or None for "not a record")
SHAPES: list[tuple[bytes, tuple[object, ...] | None]] = [
    # as this cosyclone writes it: sharded wavs/<shard>/, format, encoding, counts, fingerprint
    (json.dumps({"id": "now", "line": 3, "status": "ok", "file": "wavs/a1b/now.flac", "audio_format": "flac",
                 "encoding": "pcm24", "samples": 4800, "sample_rate": 16000, "finished_at": 1700000000.5,
                 "fingerprint": "fp", "fingerprint_parts": {"text": "t1"}, "text": "a\u2028b"},
                ensure_ascii=False).encode(),  # U+2028 raw inside a text: still one line
     ("now", "ok", "wavs/a1b/now.flac", "flac", 3, 1700000000.5, 4800, 16000, "fp")),
    # before audio formats (eval's old fixtures): a "wav" path, no file, format, line, time or counts
    (b'{"audio_seconds": 0.0, "id": "old", "seed": 11, "status": "ok", "wav": "wavs/old.wav"}',
     ("old", "ok", "wavs/old.wav", "wav", 0, 0.0, None, None, None)),
    # flat wavs/<id>.wav under "file", before formats were recorded
    (b'{"id": "flat", "line": 2, "status": "ok", "file": "wavs/flat.wav", "finished_at": 2.0}',
     ("flat", "ok", "wavs/flat.wav", "wav", 2, 2.0, None, None, None)),
    # a failed row: no file, a reason
    (b'{"id": "bad", "line": 4, "status": "failed", "reason": "oom", "file": null, "finished_at": 3}',
     ("bad", "failed", None, None, 4, 3.0, None, None, None)),
    # no status at all, and a status that is not a string: failed
    (b'{"id": "bare"}', ("bare", "failed", None, None, 0, 0.0, None, None, None)),
    (b'{"id": "odd", "status": 1, "line": "7", "finished_at": NaN, "samples": true}',
     ("odd", "failed", None, None, 0, 0.0, None, None, None)),
    # not records: torn by a kill, not an object, no string id, not UTF-8, empty
    (b'{"id": "torn", "status": "o', None),
    (b"[1, 2]", None),
    (b'{"id": 5, "status": "ok"}', None),
    (b'{"status": "ok"}', None),
    (b'{"id": "../escape", "status": "ok", "file": "wavs/x.wav"}', None),  # an id the manifest refuses
    (b'\xff\xfe{"id"', None),
    (b"", None),
]


def _keyed(rec: object) -> tuple[object, ...]:
    return tuple(getattr(rec, name) for name in KEYED)


def test_every_line_shape_reads_by_the_one_rule() -> None:
    for raw, want in SHAPES:
        got = parse_record(raw)
        assert (None if got is None else _keyed(got)) == want, raw
        if got is None:
            continue
        assert parse_record(raw.decode("utf-8")) == got  # text or bytes alike
        assert parse_record(dict(got.obj)) == got  # the object the writer holds alike
        typed = RowRecord.from_json(got.obj)
        assert typed is not None and _keyed(typed) == want, raw  # the typed record keys on the same
        index_row = dict(zip(COLUMNS, row_values(got, "diagnostics.jsonl", 0), strict=True))
        assert tuple(index_row[k] for k in ("id", "status", "file", "line", "finished_at", "samples",
                                            "sample_rate", "fingerprint")) == (
            got.id, got.status, got.file, got.line, got.finished_at, got.samples, got.sample_rate,
            got.fingerprint)


def test_every_reader_of_a_folder_takes_the_same_lines_as_records(tmp_path: Path) -> None:
    (tmp_path / runfolder.DIAG_NAME).write_bytes(b"\n".join(raw for raw, _ in SHAPES) + b"\n")
    records = {str(want[0]): want for _, want in SHAPES if want is not None}
    whole = read_records(tmp_path)
    assert {rid: _keyed(rec) for rid, rec in whole.items()} == records
    index = runfolder.open_index(tmp_path)
    try:
        found = list(index.get_many(sorted(records)))
        assert {row.id for row in found} == set(records)
        for row in found:
            assert (row.status, row.file, row.line, row.finished_at, row.samples, row.sample_rate,
                    row.fingerprint) == tuple(records[row.id][i] for i in (1, 2, 4, 5, 6, 7, 8))
            held = index.record(row)
            assert isinstance(held, RecordLine) and _keyed(held) == records[row.id]
    finally:
        index.close()
    exported = RecordIndex(tmp_path)
    try:
        assert exported.rows == len(records)
        ok = {rid for rid, want in records.items() if want[1] == "ok"}
        assert exported.ok_rows == len(ok)
        assert {rec.id for rec, _ in exported.records()} == ok
        assert {rid for rid, _ in exported.failed()} == set(records) - ok
    finally:
        exported.close()


def test_a_line_that_is_not_a_record_says_why() -> None:
    assert why_not_a_record(b'{"id": "torn", "status": "o') == "not JSON"
    assert why_not_a_record('{"id": "../escape"}') == why_not_a_record(b"[1]") == "no valid id"


def test_fingerprint_parts_are_read_from_the_line_or_from_the_whole_line() -> None:
    written = json.dumps({"id": "r", "fingerprint_parts": {"text": "t1", "seed": "s"}, "text": "x"})
    assert fingerprint_parts(written) == {"text": "t1", "seed": "s"}
    spaced = '{"id":"r","fingerprint_parts":{"text":"t1"}}'  # not as cosyclone writes it: read whole
    assert fingerprint_parts(spaced) == {"text": "t1"}
    assert fingerprint_parts('{"id": "r", "fingerprint_parts": null}') is None
    assert fingerprint_parts('{"id": "r"') is None
