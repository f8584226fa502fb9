"""A row's outcome: what happened to it in the stages, and the record the writer commits.

Why one module: a row's record used to be a dict built in five places (the batch, the row
retried alone, a row that failed before any stage, Ray's results, the run's stamp). Here
:class:`RowOutcome` is the typed outcome, :class:`RowRecord` its record (audio and the
diagnostics line), and :func:`record_of` the one way from one to the other.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cosyclone.errors import CosycloneError

_ABORTS = ("no_finite_logits", "error")

# Why a row failed (``RowOutcome.reason``); sampler aborts use their stop reason
# ("no_finite_logits", "error").
BAD_INPUT = "bad_input"  # a CosycloneError raised in a stage: something the user can fix, named in `error`
EXCEPTION = "exception"  # any other exception in a stage: type, message and traceback are recorded
NO_TOKENS = "no_speech_tokens"  # the talker stopped before emitting a speech token
EMPTY_AFTER_SPEED = "empty_after_speed"  # the row's speed leaves a segment 0 mel frames (int(2n / speed) == 0)
NONFINITE_AUDIO = "nonfinite_audio"  # code2wav produced NaN/inf samples (under --nonfinite-audio fail)



@dataclass
class RowOutcome:
    """What happened to one row (also the diagnostics.jsonl line, via :meth:`to_dict`)."""

    row_id: str
    line: int
    seed: int  # the row's seed, derived once (manifest seed, else row_seed(--seed, id)); the sampler uses it
    status: str = "ok"  # ok | failed
    error: str | None = None  # "<stage>: <what happened>" for a failed row
    reason: str | None = None  # why it failed: BAD_INPUT, EXCEPTION, NO_TOKENS, ... or the sampler's stop reason
    error_type: str | None = None  # exception class name when a stage raised
    traceback: str | None = None  # formatted traceback when a stage raised something other than CosycloneError
    stop_reasons: list[str] = field(default_factory=list)  # one per segment
    tokens: list[int] = field(default_factory=list)  # speech tokens per segment (after silent filter)
    audio_seconds: float = 0.0
    nonfinite_audio_samples: int = 0  # NaN/inf samples in the row's code2wav output (failed or zeroed)
    seconds: dict[str, float] = field(default_factory=dict)  # frontend / talker / flow / hift shares
    sampler: list[dict[str, Any]] = field(default_factory=list)  # SamplerRowDiagnostics.to_dict per segment
    segments: list[dict[str, Any]] = field(default_factory=list)  # what the LLM read, per segment: normalized
    # text, its target ids ("text_ids") and the prompt text ids before it ("prompt_ids"), counts only

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["id"] = out.pop("row_id")
        return out

    def fail(self, stage: str, reason: str, message: str) -> None:
        """Mark the row failed (the first failure wins: later stages do not overwrite it)."""
        if self.status == "ok":
            self.status, self.reason, self.error = "failed", reason, f"{stage}: {message}"

    def fail_exc(self, stage: str, exc: BaseException, *, note: str = "") -> None:
        """Mark the row failed by an exception: type and message always, the traceback unless the
        exception is a :class:`CosycloneError` (a user-fixable error whose message says it all)."""
        if self.status != "ok":
            return
        user = isinstance(exc, CosycloneError)
        self.fail(stage, BAD_INPUT if user else EXCEPTION, f"{type(exc).__name__}: {exc}{note}")
        self.error_type = type(exc).__name__
        if not user:
            self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))



@dataclass
class RowRecord:
    """One row's outcome as the writer takes it: the audio (None for a failed row) and its diagnostics line."""

    row_id: str  # manifest id
    wav: np.ndarray | None  # (N,) float32 in [-1, 1], None when the row failed
    diagnostics: dict[str, Any] = field(default_factory=dict)  # the diagnostics.jsonl object


def record_of(oc: RowOutcome, wav: np.ndarray | None) -> RowRecord:
    """The record of an outcome; ``diagnostics["wav"]`` names the file the writer will make (None: none)."""
    d = oc.to_dict()
    d["wav"] = f"wavs/{oc.row_id}.wav" if wav is not None else None
    return RowRecord(row_id=oc.row_id, wav=wav, diagnostics=d)


def failed_record(row_id: str, line: int, seed: int, stage: str, exc: BaseException, *, note: str = "") -> RowRecord:
    """A row that failed as a whole in ``stage`` (its traceback kept unless the error is the user's)."""
    oc = RowOutcome(row_id=row_id, line=line, seed=seed)
    oc.fail_exc(stage, exc, note=note)
    return record_of(oc, None)
