"""One row schema: the fields of a row are declared once (``RowCore``) and the engine's result and the
folder's record both carry them, so a field added there reaches the record, ``diagnostics.jsonl``
and its docs table with no second edit; records of older versions still read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from cosyclone.engine.outcome import RowCore, RowOutcome, RowResult, SegmentText, join_segments
from cosyclone.folder import fingerprint
from cosyclone.folder.row_record import NO_FILE, RowRecord, RowStamp, make_record
from cosyclone.talker.diagnostics import STOP_REASONS, SamplerRowDiagnostics, row_stop_reason


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_result_and_the_record_are_the_core_plus_their_own_fields() -> None:
    core = _names(RowCore)
    assert core <= _names(RowResult) and core <= _names(RowRecord)
    assert _names(RowResult) - core == {"audio", "sample_rate"}
    assert _names(RowRecord) - core == _names(RowStamp) | {f.name for f in dataclasses.fields(NO_FILE)} | {
        "finished_at"}


def test_a_record_holds_every_core_value_of_its_result(tmp_path: Path) -> None:
    oc = RowOutcome("r", 3, 2**64 - 1)
    oc.read([SegmentText("Hello there.", 4, 2), SegmentText("How are you?", 5, 2)])
    oc.decoded("eos", 7, SamplerRowDiagnostics(row_id="r", seed=1, steps=8))
    oc.decoded("max_len", 9, None)
    oc.took("talker", 0.5)
    oc.took("talker", 0.25)
    oc.nonfinite(2)
    result = oc.result(np.zeros(4800, np.float32), 24000)
    assert result.stop_reasons == ("eos", "max_len") and result.stop_reason == "max_len"
    assert result.normalized_text == "Hello there. How are you?" and result.seconds == {"talker": 0.75}
    assert result.audio_seconds == 0.2 and result.nonfinite_audio_samples == 2
    stamp = RowStamp(
        fingerprint="f",
        fingerprint_parts={},
        run_id="x",
        text="t",
        prompt_text="",
        prompt_audio="p",
        mode="zero_shot",
        instruct="",
        speed=1.0,
        manifest="m",
        shard=None,
        meta={"speaker": "anna"},
    )
    record = make_record(result, stamp, NO_FILE)
    assert {k: getattr(record, k) for k in _names(RowCore)} == {
        k: getattr(result, k) for k in _names(RowCore)
    }
    back = RowRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert back == record


def test_the_first_failure_wins_and_keeps_its_traceback() -> None:
    oc = RowOutcome("r", 1, 0)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        oc.fail_exc("talker", exc)
    oc.fail("code2wav", "nonfinite_audio", "later")
    result = oc.result(np.zeros(10, np.float32), 24000)
    assert (result.status, result.reason, result.error_type) == ("failed", "exception", "RuntimeError")
    assert result.error == "talker: RuntimeError: boom" and "Traceback" in (result.traceback or "")
    assert result.audio is None and result.audio_seconds == 0.0


def test_a_records_stop_reason_and_normalized_text_are_derived_when_an_older_line_lacks_them() -> None:
    old = {"id": "r", "line": 1, "status": "ok", "seed": 5, "stop_reasons": ["eos", "eos"],
           "segments": [{"text": "今天", "text_ids": 2, "prompt_ids": 0}, {"text": "很好", "text_ids": 2}],
           "finished_at": 1.0, "device_kind": "gone"}
    rec = RowRecord.from_json(old)
    assert rec is not None and rec.stop_reason == "eos" and rec.normalized_text == "今天很好"
    assert rec.meta is None and rec.device is None and rec.threads is None


def test_one_stop_reason_vocabulary() -> None:
    assert STOP_REASONS == ("eos", "max_len", "no_finite_logits", "error")
    assert row_stop_reason([]) is None and row_stop_reason(["eos", "eos"]) == "eos"
    assert row_stop_reason(["eos", "max_len", "error"]) == "max_len"
    assert join_segments(["One.", "Two.", "三。", "四。", "Five"]) == "One. Two.三。四。Five"


def test_where_a_row_ran_is_not_in_its_fingerprint_and_older_records_still_match() -> None:
    assert {"device", "threads"}.isdisjoint(fingerprint.PARTS)
    parts = {k: f"h-{k}" for k in fingerprint.PARTS}
    fp = "new"
    older = {**parts, "device": "d", "threads": "t"}  # an older version fingerprinted where the row ran
    assert fingerprint.same_inputs("old", older, fp, parts)
    assert not fingerprint.same_inputs("old", {**older, "seed": "other"}, fp, parts)
    assert not fingerprint.same_inputs("old", None, fp, parts) and fingerprint.same_inputs(
        fp, None, fp, parts
    )
