"""What a replay says about its row: reproduced or not, where the numbers first broke, what that
touched, and where two replays of the same row part.

Why these questions: a record says "46 steps entirely NaN"; the engineer who reads it needs to know
whether the replay is the same computation (else nothing it shows explains the record), the first
step and layer that went non-finite (the root; everything after is its consequence), and whether
the cause is the row's prompt, its text or the weights, which decides what else is affected: every
row with that prompt, only this text, or every row of the folder.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from cosyclone.engine.outcome import NONFINITE_AUDIO
from cosyclone.folder.audio_out import AudioOutput, process
from cosyclone.folder.row_record import RowRecord
from cosyclone.talker.diagnostics import SamplerRowDiagnostics
from cosyclone.trace.probes import LayerFacts, StepFacts
from cosyclone.trace.replay import Replay, SegmentTrace, part_at

#: Sampler fields that describe the hardware path, not the computation (a CUDA graph replays the same step).
_NOT_COMPARED = frozenset({"graph_steps", "row_id", "seconds"})
_SAMPLER_FIELDS = tuple(f.name for f in fields(SamplerRowDiagnostics) if f.name not in _NOT_COMPARED)

#: What the part of the prompt where the overflow starts says about its cause.
TOUCHED = {
    "sos": "weights: position 0 (the start token) holds nothing of this row, so every row breaks there",
    "prompt text": "prompt: its transcript alone already overflows, before this row's text; every row "
                   "with this prompt shares it",
    "text": "text: the prompt's transcript passes; this row's text takes it over",
    "task": "text: the texts pass up to the task token, which this row's text takes over",
    "prompt speech": "prompt: the texts pass; the prompt's speech tokens take it over (rows with this prompt "
                     "are likely to share it)",
}


@dataclass(frozen=True)
class Break:
    """The first place a replay's numbers went non-finite."""

    segment: int  # the text segment
    step: int  # the draw whose logits it made (0: the prompt's pass)
    where: str  # "layer 3", "norm", "decoder head" (layers finite, logits not), "logits" (no --layers)
    position: int | None  # in the prompt's pass: the first position holding a non-finite value
    part: str | None  # that position's part: sos, prompt text, text, task, prompt speech
    detail: str  # what was seen there


@dataclass(frozen=True)
class Sharing:
    """The folder's rows that share this row's prompt or text, and how many of those went non-finite."""

    same_prompt: tuple[int, int]  # (rows with this prompt recording, of them non-finite)
    same_text: tuple[int, int]  # (rows with this text, of them non-finite)
    folder: tuple[int, int]  # (rows in the folder, of them non-finite)


@dataclass(frozen=True)
class Verdict:
    """The first lines of a trace."""

    reproduced: bool | None  # the replay drew the recorded tokens: counts, stop reasons, sampler counters,
    # status (None: no record to compare with)
    mismatches: tuple[str, ...]  # what differed from the record
    audio: str  # the audio against the recorded file: same bytes, same up to float32 rounding, or differs
    talker_break: Break | None  # the first non-finite step (and layer, with --layers)
    audio_break: str | None  # the first non-finite DiT block or HiFT stage (with --layers)
    touched: str  # what the break touched: prompt, text, weights, or the generated tokens
    flat: tuple[int, int, float] | None  # (segment, step, value) of the first draw whose logits were all
    # equal: a hidden state zeroed (an RMSNorm whose square overflowed) makes uniform draws without a NaN
    sharing: Sharing | None  # the folder's rows that share the prompt or the text


def nonfinite_row(rec: RowRecord) -> bool:
    """A record of a row whose numbers broke somewhere (logits or audio)."""
    if rec.reason in ("no_finite_logits", "error", NONFINITE_AUDIO) or rec.nonfinite_audio_samples > 0:
        return True
    return any(s.nan_steps or s.posinf_steps or s.no_finite_steps for s in rec.sampler)


def judge(replay: Replay, record: RowRecord | None, records: Sequence[RowRecord], *,
          audio_bytes: bytes | None, output: AudioOutput) -> Verdict:
    """The verdict on ``replay`` against the row's ``record`` and its recorded file's ``audio_bytes``."""
    mismatches = tuple(compare_record(replay, record)) if record is not None else ()
    audio = audio_fingerprint(replay, audio_bytes, output)
    if audio.startswith("differs") and replay.stage_dtypes.get("flow", "fp32") != "fp32":
        audio += (f"; the flow ran in {replay.stage_dtypes['flow']}, whose rounding depends on the batch a "
                  "row is decoded in (the replay decodes it alone)")
    brk = first_break(replay.segments)
    sharing = share(record, records) if record is not None and records else None
    return Verdict(reproduced=None if record is None else not mismatches, mismatches=mismatches, audio=audio,
                   talker_break=brk, audio_break=first_bad(replay.code2wav_layers),
                   touched=touched(brk, replay, audio_broke=replay.result.reason == NONFINITE_AUDIO),
                   sharing=sharing, flat=first_flat(replay.segments))


def compare_record(replay: Replay, record: RowRecord) -> list[str]:
    """The fields of the record the replay's result does not match (empty: reproduced)."""
    res = replay.result
    out = [name for name in ("status", "reason", "tokens", "stop_reasons", "nonfinite_audio_samples")
           if getattr(res, name) != getattr(record, name)]
    if len(res.sampler) != len(record.sampler):
        out.append("sampler")
    for a, b in zip(res.sampler, record.sampler, strict=False):
        out += [f"sampler[{a.segment}].{n}" for n in _SAMPLER_FIELDS if getattr(a, n) != getattr(b, n)]
    return out


def audio_fingerprint(replay: Replay, recorded: bytes | None, output: AudioOutput) -> str:
    """The replay's audio, written as the run wrote its file, against that file.

    Equal bytes (sha256) first; otherwise the decoded samples: a row decoded in another batch may move
    by float32 rounding (matmul and conv kernels are chosen by batch size, docs/architecture.md), at
    most one step of the file's encoding on a few samples, which is the same computation.
    """
    wav = replay.result.audio
    if wav is None:
        return "none (the replay made no audio: " + (replay.result.reason or "failed") + ")"
    try:
        data, _ = process(wav, model_rate=replay.result.sample_rate, out=output)
    except ValueError as exc:
        return f"not writable ({exc})"
    mine = hashlib.sha256(data).hexdigest()[:16]
    if recorded is None:
        return f"sha256 {mine} (no recorded file to compare)"
    theirs = hashlib.sha256(recorded).hexdigest()[:16]
    if mine == theirs:
        return f"same bytes (sha256 {mine})"
    a, b = _samples(data), _samples(recorded)
    step = _STEP.get(output.encoding, 0.0)
    if a.shape == b.shape:
        diff = np.abs(a - b)
        worst, moved = float(diff.max(initial=0.0)), int(np.count_nonzero(diff))
        if worst <= step * 1.001 + 1e-6:
            return (f"same up to float32 rounding ({moved} of {a.size} samples moved, at most {worst:.3g}; "
                    f"sha256 {mine}, recorded {theirs})")
        return f"differs (max difference {worst:.3g}; sha256 {mine}, recorded {theirs})"
    return f"differs ({a.size} samples, recorded {b.size}; sha256 {mine}, recorded {theirs})"


#: One step of each encoding, in samples of full scale 1.0.
_STEP = {"pcm16": 1 / 32768, "pcm24": 1 / 8388608, "float": 0.0}


def _samples(data: bytes) -> np.ndarray:
    """An audio file's samples as float64 (WAV or FLAC)."""
    import soundfile

    wav, _ = soundfile.read(io.BytesIO(data), dtype="float64", always_2d=False)
    return np.asarray(wav).reshape(-1)


def first_bad(calls: Sequence[LayerFacts]) -> str | None:
    """The first call (in the order they ran) whose output held a non-finite value."""
    bad = next((c for c in calls if not c.finite), None)
    if bad is None:
        return None
    return f"{bad.stage} {bad.name}, call {bad.call} ({bad.nonfinite} non-finite values)"


def first_flat(segments: Sequence[SegmentTrace]) -> tuple[int, int, float] | None:
    """The first draw whose finite logits were all one value (at least two of them)."""
    for seg in segments:
        for s in seg.steps:
            if s.logit_min is not None and s.logit_min == s.logit_max and len(s.top) > 1:
                return seg.segment, s.step, s.logit_min
    return None


def first_break(segments: Sequence[SegmentTrace]) -> Break | None:
    """The first non-finite step of the row, named down to the layer when layers were traced."""
    for seg in segments:
        layer = next((c for c in seg.layers if not c.finite), None)  # calls are in the order they ran
        step = next((s for s in seg.steps if s.nan or s.posinf or s.neginf), None)
        if layer is None and step is None:
            continue
        if layer is not None and (step is None or layer.call <= step.step):
            position = layer.first_bad_position if layer.call == 0 else None
            if layer.call == 0:  # the earliest position any layer broke at in the prompt's pass
                firsts = [c.first_bad_position for c in seg.layers if c.call == 0]
                position = min((p for p in firsts if p is not None), default=position)
            return Break(segment=seg.segment, step=layer.call, where=layer.name, position=position,
                         part=part_at(seg.layout, position) if position is not None else None,
                         detail=f"{layer.nonfinite} non-finite values" + _rest(layer.absmax))
        assert step is not None
        where = "decoder head" if seg.layers else "logits"
        return Break(segment=seg.segment, step=step.step, where=where, position=None, part=None,
                     detail=f"logits: {step.nan} NaN, {step.posinf} +inf, {step.neginf} -inf")
    return None


def _rest(absmax: float | None) -> str:
    return " (nothing finite)" if absmax is None else f" (abs max of the rest: {absmax:.4g})"


def touched(brk: Break | None, replay: Replay, *, audio_broke: bool = False) -> str:
    """What the first break says about its cause."""
    if brk is None and audio_broke:
        return ("code2wav: the talker's numbers are finite, the audio is not (the flow or HiFT: with "
                "--layers the first non-finite block or stage is named)")
    if brk is None:
        traced = bool(replay.segments and replay.segments[0].layers)
        return "nothing: every logit" + (" and every traced layer" if traced else "") + " finite"
    if brk.part is not None:
        return TOUCHED.get(brk.part, brk.part)
    if brk.where == "logits":
        if brk.step == 0:
            return "the prompt's pass (step 0): run with --layers to name the layer and the position"
        return (f"the generated tokens: the prompt and text pass; step {brk.step} breaks (run with --layers "
                "to name the layer)")
    if brk.where == "decoder head":
        return "the decoder head: every layer is finite, the logits are not (its weights or the dtype)"
    return f"the generated tokens: the prompt and text pass, step {brk.step}'s token breaks {brk.where}"


def share(record: RowRecord, records: Sequence[RowRecord]) -> Sharing:
    """The folder's rows with this row's prompt or text, and how many of them went non-finite too."""
    def count(rows: list[RowRecord]) -> tuple[int, int]:
        return len(rows), sum(1 for r in rows if nonfinite_row(r))

    return Sharing(same_prompt=count([r for r in records if r.prompt_audio == record.prompt_audio]),
                   same_text=count([r for r in records if r.text == record.text]),
                   folder=count(list(records)))


@dataclass(frozen=True)
class Divergence:
    """Where two replays of one row first part: in their numbers, and in what they drew."""

    numbers_segment: int | None  # the first segment and step whose logits differ (None: equal everywhere)
    numbers_step: int | None
    max_abs_diff: float | None  # the largest |difference| of the finite logits at that step
    segment: int | None  # the first segment and step that drew differently (None: the same draws throughout)
    step: int | None
    a: str  # what the first replay drew there ("token 12", "stop 6561", "aborted", "ended")
    b: str  # what the second drew


def diverge(a: Replay, b: Replay) -> Divergence:
    """The first step at which the replays' logits differ, and the first at which they drew differently."""
    numbers: tuple[int, int, float | None] | None = None
    draws: tuple[int, int, str, str] | None = None
    for sa, sb in zip(a.segments, b.segments, strict=False):
        for k in range(max(len(sa.steps), len(sb.steps))):
            if numbers is None and k < len(sa.logits) and k < len(sb.logits) \
                    and not torch.equal(sa.logits[k].nan_to_num(0.5), sb.logits[k].nan_to_num(0.5)):
                numbers = (sa.segment, k, _max_diff(sa.logits[k], sb.logits[k]))
            x = _did(sa.steps[k]) if k < len(sa.steps) else "ended"
            y = _did(sb.steps[k]) if k < len(sb.steps) else "ended"
            if draws is None and x != y:
                draws = (sa.segment, k, x, y)
        if draws is not None:
            break
    if draws is None and len(a.segments) != len(b.segments):
        n = min(len(a.segments), len(b.segments))
        draws = (n, 0, f"{len(a.segments)} segments", f"{len(b.segments)} segments")
    seg, step, diff = numbers if numbers is not None else (None, None, None)
    dseg, dstep, x, y = draws if draws is not None else (None, None, "", "")
    return Divergence(numbers_segment=seg, numbers_step=step, max_abs_diff=diff, segment=dseg, step=dstep,
                      a=x, b=y)


def _max_diff(x: torch.Tensor, y: torch.Tensor) -> float | None:
    both = torch.isfinite(x) & torch.isfinite(y)
    return float((x[both] - y[both]).abs().max()) if bool(both.any()) else None


def _did(step: StepFacts) -> str:
    if step.aborted:
        return "aborted"
    return f"stop {step.token}" if step.stop else f"token {step.token}"
