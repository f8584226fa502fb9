"""A row's result: what happened to it in the stages, typed, with its audio.

Why two types: the stages mark a row as they go (a frontend failure, a sampler abort, seconds per
stage), so :class:`RowOutcome` is mutable and private to the engine; what leaves the engine is
:class:`RowResult`, frozen, built in one place (:meth:`RowOutcome.result`). The API hands it to the
user as it is; the run folder adds what made it (fingerprint, the row's fields, the run) and the file
it wrote (:class:`cosyclone.run.row_record.RowRecord`). The engine knows nothing of folders.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cosyclone.errors import CosycloneError
from cosyclone.talker.diagnostics import SamplerRowDiagnostics

ABORTS = ("no_finite_logits", "error")  # sampler stop reasons that end a row as failed

# Why a row failed (``RowResult.reason``); sampler aborts use their stop reason (ABORTS).
BAD_INPUT = "bad_input"  # a CosycloneError raised in a stage: something the user can fix, named in `error`
EXCEPTION = "exception"  # any other exception in a stage: type, message and traceback are recorded
NO_TOKENS = "no_speech_tokens"  # the talker stopped before emitting a speech token
EMPTY_AFTER_SPEED = "empty_after_speed"  # the row's speed leaves a segment 0 mel frames (int(2n / speed) == 0)
NONFINITE_AUDIO = "nonfinite_audio"  # code2wav produced NaN/inf samples (under --nonfinite-audio fail)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for a device (or host allocator) out-of-memory error, whatever the backend calls it."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


@dataclass(frozen=True)
class Failure:
    """An exception as a row's record needs it (type, message, traceback text), holding no frame.

    Why: a live exception's traceback keeps every frame of the failed call alive, and with them its
    tensors (a talker attempt's KV cache, a code2wav call's activations). Recovery takes a
    :class:`Failure` inside the ``except`` block and frees and retries after the block has ended,
    so an out-of-memory retry starts with the failed attempt's memory already returned.
    """

    type_name: str  # the exception's class name
    message: str  # str(exc)
    trace: str | None  # the formatted traceback; None for a user error (its message says it all)
    user: bool  # a CosycloneError: something the user can fix
    oom: bool  # an out-of-memory error (:func:`is_out_of_memory`)

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        user = isinstance(exc, CosycloneError)
        trace = None if user else "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type_name=type(exc).__name__, message=str(exc), trace=trace, user=user,
                   oom=is_out_of_memory(exc))

    def describe(self) -> str:
        """``Type: message``, as a row's error and a batch's note quote it."""
        return f"{self.type_name}: {self.message}"


@dataclass(frozen=True)
class SegmentText:
    """What the LLM read for one text segment of a row (counts only: a bad row traces to its text)."""

    text: str  # the normalized segment text
    text_ids: int  # its text token ids (the target the length limits scale with)
    prompt_ids: int  # the prompt text ids read before it (0 outside zero_shot)

    @classmethod
    def from_json(cls, obj: Any) -> SegmentText:
        d = obj if isinstance(obj, dict) else {}
        return cls(text=str(d.get("text") or ""), text_ids=int(d.get("text_ids") or 0),
                   prompt_ids=int(d.get("prompt_ids") or 0))


@dataclass(frozen=True)
class RowResult:
    """One row as the engine finished it: its audio and what happened on the way."""

    id: str  # the manifest row's id
    line: int  # its 1-based manifest line (the API's item k is line k + 1)
    seed: int  # the row's seed, derived once (manifest seed, else row_seed(--seed, id)); -1: none could be
    status: str = "ok"  # ok | failed
    reason: str | None = None  # why it failed: bad_input, exception, no_speech_tokens, empty_after_speed,
    # nonfinite_audio, or the sampler's stop reason (no_finite_logits, error); None when ok
    error: str | None = None  # "<stage>: <what happened>" for a failed row
    error_type: str | None = None  # the exception's class name when a stage raised
    traceback: str | None = None  # the traceback when a stage raised something other than a user error
    stop_reasons: tuple[str, ...] = ()  # the talker's stop reason per segment (eos, max_len, ...)
    tokens: tuple[int, ...] = ()  # speech tokens per segment, after the silent-token filter
    audio_seconds: float = 0.0  # seconds of audio at the model's rate (0 for a failed row)
    nonfinite_audio_samples: int = 0  # NaN/inf samples code2wav produced for the row (failed or zeroed)
    seconds: dict[str, float] = field(default_factory=dict)  # wall seconds per stage: frontend, talker,
    # flow, hift (a batch's shared time divided among its rows)
    sampler: tuple[SamplerRowDiagnostics, ...] = ()  # the sampler's counters per segment (NaN, +inf,
    # no-finite and RAS events, stop reason, steps run as CUDA graphs)
    segments: tuple[SegmentText, ...] = ()  # what the LLM read per segment
    audio: np.ndarray | None = field(default=None, compare=False, repr=False)  # (N,) float32 in [-1, 1] at
    # sample_rate; None for a failed row (not part of any record: the folder keeps it as a file)
    sample_rate: int = 24000  # the rate of ``audio``: the model's (24000 for the released model)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def without_audio(self) -> RowResult:
        """The same result with its audio dropped (what a run keeps once the file is written)."""
        from dataclasses import replace

        return replace(self, audio=None)


@dataclass
class RowOutcome:
    """A row in progress: the stages mark it, :meth:`result` freezes it (engine-private)."""

    row_id: str
    line: int
    seed: int
    status: str = "ok"
    error: str | None = None
    reason: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    stop_reasons: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    audio_seconds: float = 0.0
    nonfinite_audio_samples: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    sampler: list[SamplerRowDiagnostics] = field(default_factory=list)
    segments: list[SegmentText] = field(default_factory=list)

    def fail(self, stage: str, reason: str, message: str) -> None:
        """Mark the row failed (the first failure wins: later stages do not overwrite it)."""
        if self.status == "ok":
            self.status, self.reason, self.error = "failed", reason, f"{stage}: {message}"

    def fail_exc(self, stage: str, exc: BaseException | Failure, *, note: str = "") -> None:
        """Mark the row failed by an exception: type and message always, the traceback unless the
        exception is a :class:`CosycloneError` (a user-fixable error whose message says it all)."""
        if self.status != "ok":
            return
        failure = exc if isinstance(exc, Failure) else Failure.of(exc)
        self.fail(stage, BAD_INPUT if failure.user else EXCEPTION, failure.describe() + note)
        self.error_type = failure.type_name
        self.traceback = failure.trace

    def result(self, audio: np.ndarray | None, sample_rate: int) -> RowResult:
        """The frozen result; ``audio`` only for an ok row."""
        ok = self.status == "ok"
        return RowResult(id=self.row_id, line=self.line, seed=self.seed, status=self.status, reason=self.reason,
                         error=self.error, error_type=self.error_type, traceback=self.traceback,
                         stop_reasons=tuple(self.stop_reasons), tokens=tuple(self.tokens),
                         audio_seconds=self.audio_seconds if ok else 0.0,
                         nonfinite_audio_samples=self.nonfinite_audio_samples, seconds=dict(self.seconds),
                         sampler=tuple(self.sampler), segments=tuple(self.segments),
                         audio=audio if ok else None, sample_rate=sample_rate)


def failed_result(row_id: str, line: int, seed: int, stage: str, exc: BaseException | Failure, *,
                  note: str = "",
                  sample_rate: int = 24000) -> RowResult:
    """A row that failed as a whole in ``stage`` (its traceback kept unless the error is the user's)."""
    oc = RowOutcome(row_id=row_id, line=line, seed=seed)
    oc.fail_exc(stage, exc, note=note)
    return oc.result(None, sample_rate)
