"""A row's result: what happened to it in the stages, typed, with its audio.

Why one base: a row's fields are declared once, in :class:`RowCore`. The stages mark a row as they
go (a frontend failure, a sampler abort, seconds per stage) through :class:`RowOutcome`, private to
the engine, which holds a :class:`RowCore` and replaces it at each mark; what leaves the engine is
:class:`RowResult` (the core and the audio), built in one place (:meth:`RowOutcome.result`). The API
hands it to the user as it is; the run folder's record adds what made it (fingerprint, the row's
fields, the run) and the file it wrote (:class:`cosyclone.folder.row_record.RowRecord`, also a
:class:`RowCore`). The engine knows nothing of folders.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np
import torch

from cosyclone.errors import CosycloneError
from cosyclone.talker.diagnostics import SamplerRowDiagnostics, StopReason, row_stop_reason

ABORTS = ("no_finite_logits", "error")  # sampler stop reasons that end a row as failed

# Why a row failed (``RowResult.reason``); sampler aborts use their stop reason (ABORTS).
BAD_INPUT = "bad_input"  # a CosycloneError raised in a stage: something the user can fix, named in `error`
EXCEPTION = "exception"  # any other exception in a stage: type, message and traceback are recorded
NO_TOKENS = "no_speech_tokens"  # the talker stopped before emitting a speech token
# the row's speed leaves a segment 0 mel frames (int(2n / speed) == 0)
EMPTY_AFTER_SPEED = "empty_after_speed"
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


RowStatus = Literal["ok", "failed"]  # a row's status, in its result, its record and every export


def join_segments(texts: Sequence[str]) -> str:
    """The segments' texts as one text: a space between two segments unless one side is a wide
    (CJK) character, whose scripts write no spaces."""
    out = ""
    for text in texts:
        if out and text and not (_wide(out[-1]) or _wide(text[0])) and not out[-1].isspace():
            out += " "
        out += text
    return out


def _wide(ch: str) -> bool:
    import unicodedata

    return unicodedata.east_asian_width(ch) in ("W", "F")


@dataclass(frozen=True, kw_only=True)
class RowCore:
    """The fields every form of a finished row carries: the engine's :class:`RowResult` and the run
    folder's record (:class:`cosyclone.folder.row_record.RowRecord`) both derive from it, so a field is
    declared once, here, with its comment (docs/output.md's table is generated from it)."""

    id: str  # the manifest row's id (the file's stem)
    line: int  # its 1-based manifest line (the API's item k is line k + 1)
    seed: int
    # the row's seed as used (manifest seed, else derived from --seed and the id); -1: none could be
    status: RowStatus = "ok"  # ok | failed
    reason: str | None = None  # why it failed: bad_input, exception, no_speech_tokens, empty_after_speed,
    # nonfinite_audio, no_finite_logits or error; None when ok
    error: str | None = None  # "<stage>: <what happened>" for a failed row
    error_type: str | None = None  # the exception's class name when a stage raised
    traceback: str | None = None
    # a non-user error's traceback (in a record: "see errors.jsonl", where it is)
    stop_reason: StopReason | None = None  # the row's: the first segment's that is not eos, else eos
    # (max_len: the speech was cut at the token cap); None when no segment was decoded
    stop_reasons: tuple[StopReason, ...] = ()  # the talker's stop reason per text segment
    tokens: tuple[int, ...] = ()  # speech tokens per segment, after the silent-token filter
    normalized_text: str = ""  # what the model read: the segments' normalized texts joined
    audio_seconds: float = 0.0  # seconds of audio as the model made it (before resampling and
    # --trim-silence: the file's own is metadata.jsonl's duration); 0 for a failed row
    nonfinite_audio_samples: int = 0
    # NaN/inf samples code2wav produced (the row failed, or they were zeroed)
    seconds: dict[str, float] = field(default_factory=dict)  # wall seconds per stage: frontend, talker,
    # flow, hift (a batch's shared time divided among its rows)
    sampler: tuple[SamplerRowDiagnostics, ...] = ()  # the sampler's counters per segment ("The sampler's
    # counters")
    segments: tuple[SegmentText, ...] = ()  # what the LLM read per segment: text, text_ids, prompt_ids

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, kw_only=True)
class RowResult(RowCore):
    """One row as the engine finished it: its audio and what happened on the way."""

    audio: np.ndarray | None = field(default=None, compare=False, repr=False)  # (N,) float32 in [-1, 1] at
    # sample_rate; None for a failed row (not part of any record: the folder keeps it as a file)
    sample_rate: int = 24000  # the rate of ``audio``: the model's (24000 for the released model)

    def without_audio(self) -> RowResult:
        """The same result with its audio dropped (what a run keeps once the file is written)."""
        return replace(self, audio=None)


def core_values(row: RowCore) -> dict[str, Any]:
    """The :class:`RowCore` fields of ``row`` by name (a result's, to build its record)."""
    return {f.name: getattr(row, f.name) for f in fields(RowCore)}


class RowOutcome:
    """A row in progress (engine-private): the stages mark it through the methods below, each mark
    replacing the frozen :class:`RowCore` it holds, and :meth:`result` adds the audio."""

    def __init__(self, row_id: str, line: int, seed: int) -> None:
        self.row = RowCore(id=row_id, line=line, seed=seed)

    @property
    def row_id(self) -> str:
        return self.row.id

    @property
    def status(self) -> RowStatus:
        return self.row.status

    @property
    def seed(self) -> int:
        return self.row.seed

    def read(self, segments: Sequence[SegmentText]) -> None:
        """What the frontend made of the row's text, segment by segment."""
        self.row = replace(self.row, segments=tuple(segments),
                           normalized_text=join_segments([s.text for s in segments]))

    def decoded(self, reason: StopReason, tokens: int, sampler: SamplerRowDiagnostics | None) -> None:
        """One segment's talker result: its stop reason, tokens kept and the sampler's counters."""
        reasons = (*self.row.stop_reasons, reason)
        self.row = replace(self.row, stop_reasons=reasons, stop_reason=row_stop_reason(reasons),
                           tokens=(*self.row.tokens, tokens),
                           sampler=self.row.sampler if sampler is None else (*self.row.sampler, sampler))

    def took(self, stage: str, seconds: float) -> None:
        """``seconds`` more of wall time in ``stage`` (a batch's shared time, this row's share)."""
        spent = dict(self.row.seconds)
        spent[stage] = spent.get(stage, 0.0) + seconds
        self.row = replace(self.row, seconds=spent)

    def nonfinite(self, samples: int) -> None:
        """``samples`` NaN/inf samples code2wav produced for the row."""
        self.row = replace(self.row, nonfinite_audio_samples=self.row.nonfinite_audio_samples + samples)

    def fail(self, stage: str, reason: str, message: str) -> None:
        """Mark the row failed (the first failure wins: later stages do not overwrite it)."""
        if self.row.status == "ok":
            self.row = replace(self.row, status="failed", reason=reason, error=f"{stage}: {message}")

    def fail_exc(self, stage: str, exc: BaseException | Failure, *, note: str = "") -> None:
        """Mark the row failed by an exception: type and message always, the traceback unless the
        exception is a :class:`CosycloneError` (a user-fixable error whose message says it all)."""
        if self.row.status != "ok":
            return
        failure = exc if isinstance(exc, Failure) else Failure.of(exc)
        self.fail(stage, BAD_INPUT if failure.user else EXCEPTION, failure.describe() + note)
        self.row = replace(self.row, error_type=failure.type_name, traceback=failure.trace)

    def result(self, audio: np.ndarray | None, sample_rate: int) -> RowResult:
        """The frozen result; ``audio`` (and its duration) only for an ok row."""
        ok = self.row.status == "ok"
        seconds = len(audio) / float(sample_rate) if ok and audio is not None and sample_rate else 0.0
        return RowResult(**{**core_values(self.row), "audio_seconds": seconds},
                         audio=audio if ok else None, sample_rate=sample_rate)


def failed_result(row_id: str, line: int, seed: int, stage: str, exc: BaseException | Failure, *,
                  note: str = "",
                  sample_rate: int = 24000) -> RowResult:
    """A row that failed as a whole in ``stage`` (its traceback kept unless the error is the user's)."""
    oc = RowOutcome(row_id, line, seed)
    oc.fail_exc(stage, exc, note=note)
    return oc.result(None, sample_rate)
