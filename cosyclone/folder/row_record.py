"""A row's record: a line of ``diagnostics.jsonl`` (a row's latest is its current one), typed.

Why one frozen dataclass: the record is the main output a user reads and the folder's memory
(resume, totals, export and eval read it back). It is built in one place, by the writer once the
row's file is on disk (:func:`make_record`), written in one place (:meth:`RowRecord.to_json`) and
read in one place (:meth:`RowRecord.from_json`), and docs/output.md's field table is generated
from the comments below (tests/docs/test_output_docs.py keeps them equal).

Reading is tolerant: a line written by an older cosyclone lacks newer fields (they take their
defaults) and may hold fields since dropped (ignored); lines are never rewritten. Which line is a
record, and the fields every reader keys on, are :func:`cosyclone.folder.record_line.parse_record`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from cosyclone.engine.outcome import RowCore, RowResult, SegmentText, core_values, join_segments
from cosyclone.folder.record_line import RecordLine, parse_record
from cosyclone.manifest.rows import Meta
from cosyclone.options import Mode
from cosyclone.talker.diagnostics import STOP_REASONS, SamplerRowDiagnostics, row_stop_reason


@dataclass(frozen=True, kw_only=True)
class RowStamp:
    """What made a row, beside its result: the inputs it was made from and the run that made it."""

    fingerprint: str | None  # the row's fingerprint (None: it failed before one could be made)
    fingerprint_parts: dict[str, str] | None  # the fingerprint's parts (what changed, on a redo)
    run_id: str | None  # the invocation that made it (its line in runs.jsonl: versions, host, options)
    text: str  # the manifest's text
    prompt_text: str  # the manifest's prompt transcript
    prompt_audio: str  # the prompt recording's path as resolved
    mode: Mode  # zero_shot | cross_lingual | instruct2
    instruct: str  # the instruction (instruct2)
    speed: float  # the speaking-rate factor
    manifest: str | None  # the manifest as given on the command line
    shard: str | None  # --shard i/N of the run that made it
    meta: Meta | None = None  # the manifest row's meta object as written (speaker, language, ...); None: none
    device: str | None = None  # the backend the row ran on (cpu | cuda | rocm): recorded, not fingerprinted
    threads: str | None = None
    # the CPU intra-op threads it ran with ("-" on a GPU): recorded, not fingerprinted
    llm: str | None = None
    # the talker file that made it (--llm: llm.pt, llm.rl.pt; part of the fingerprint); dummy: random weights
    # (--load-format dummy); None: a record written before cosyclone named its talker


@dataclass(frozen=True)
class FileFacts:
    """The audio file a row's record vouches for, as the writer wrote it."""

    file: str | None  # the audio file relative to the folder (wavs/<shard>/<id>.wav or .flac); None: failed
    samples: int | None  # samples in the file (a resume checks the file still holds them)
    sample_rate: int | None  # the file's sample rate
    audio_format: str | None  # wav | flac
    encoding: str | None  # pcm16 | pcm24 | float
    trimmed_lead_seconds: float  # leading silence cut by --trim-silence (0.0 without it)
    trimmed_trail_seconds: float  # trailing silence cut by --trim-silence (0.0 without it)

    @property
    def duration(self) -> float:
        """The file's duration in seconds (0.0: no file): the duration every figure and export reports."""
        return self.samples / float(self.sample_rate) if self.samples and self.sample_rate else 0.0


@dataclass(frozen=True, kw_only=True)
class RowRecord(RowCore, RowStamp, FileFacts):
    """One line of ``diagnostics.jsonl``: a row's latest attempt, flat (its result, what made it and its
    file are the fields of :class:`~cosyclone.engine.outcome.RowCore`, :class:`RowStamp` and
    :class:`FileFacts`, declared once there)."""

    finished_at: float  # when the record was committed (Unix time); the latest wins across journals

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to the journal and ``diagnostics.jsonl``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stop_reasons"], out["tokens"] = list(self.stop_reasons), list(self.tokens)
        out["segments"] = [asdict(s) for s in self.segments]
        out["sampler"] = [s.to_dict() for s in self.sampler]
        return out

    @classmethod
    def from_json(cls, line: Mapping[str, Any] | RecordLine) -> RowRecord | None:
        """A record read back (older lines included: :func:`~cosyclone.folder.record_line.parse_record`
        reads the fields every reader keys on); None when ``line`` is not a row record."""
        head = line if isinstance(line, RecordLine) else parse_record(line)
        if head is None:
            return None
        obj, rid = head.obj, head.id
        values = {f.name: obj.get(f.name, _DEFAULTS.get(f.name)) for f in fields(cls)}
        values.update(id=rid, status=head.status, file=head.file, audio_format=head.audio_format,
                      line=head.line, finished_at=head.finished_at, samples=head.samples,
                      sample_rate=head.sample_rate, fingerprint=head.fingerprint)
        for name, default in _DEFAULTS.items():
            if values[name] is None:
                values[name] = default
        values["stop_reasons"] = tuple(str(x) for x in values["stop_reasons"])
        values["tokens"] = tuple(int(x) for x in values["tokens"])
        values["segments"] = tuple(SegmentText.from_json(x) for x in values["segments"])
        values["sampler"] = tuple(_sampler(x, rid) for x in values["sampler"] if isinstance(x, dict))
        if values["stop_reason"] not in STOP_REASONS:  # an older line: derived from its segments'
            values["stop_reason"] = row_stop_reason(values["stop_reasons"])
        if not isinstance(values["normalized_text"], str) or "normalized_text" not in obj:
            values["normalized_text"] = join_segments([s.text for s in values["segments"]])
        if not isinstance(values["meta"], dict):
            values["meta"] = None
        return cls(**values)


_SAMPLER_FIELDS = frozenset(f.name for f in fields(SamplerRowDiagnostics))


def _sampler(obj: Mapping[str, Any], row_id: str) -> SamplerRowDiagnostics:
    """One segment's sampler counters read back (keys of other versions ignored, missing ones zero)."""
    known = {k: v for k, v in obj.items() if k in _SAMPLER_FIELDS}
    known.setdefault("row_id", row_id)
    known.setdefault("seed", -1)
    return SamplerRowDiagnostics(**known)


# Values a field takes when an older line lacks it (or holds null where a value is required).
_DEFAULTS: dict[str, Any] = {
    "line": 0, "status": "failed", "seed": -1, "text": "", "prompt_text": "", "prompt_audio": "",
    "mode": "zero_shot", "instruct": "", "speed": 1.0, "audio_seconds": 0.0, "trimmed_lead_seconds": 0.0,
    "trimmed_trail_seconds": 0.0, "nonfinite_audio_samples": 0, "stop_reasons": (), "tokens": (),
    "segments": (), "sampler": (), "seconds": {}, "finished_at": 0.0, "normalized_text": "",
}


def make_record(result: RowResult, stamp: RowStamp, facts: FileFacts, *,
                traceback_note: str | None = None) -> RowRecord:
    """The record of a written row: the engine's result, what made it, and the file on disk."""
    core = core_values(result)
    core["traceback"] = traceback_note if result.traceback else None
    return RowRecord(**core, **{f.name: getattr(stamp, f.name) for f in fields(RowStamp)},
                     **{f.name: getattr(facts, f.name) for f in fields(FileFacts)}, finished_at=time.time())


NO_FILE = FileFacts(file=None, samples=None, sample_rate=None, audio_format=None, encoding=None,
                    trimmed_lead_seconds=0.0, trimmed_trail_seconds=0.0)
