"""The figures the page shows, one pass over the merged row records: columns of numbers, one entry per row.

Why columns: a night of 100,000 rows is plotted, ranked and screened for outliers as numpy arrays
(a histogram or a median of 100,000 floats takes milliseconds), while the records themselves stay
as the folders' reader returned them. Eval's figures join by id, and only when
eval scored the attempt on disk (its seed is the record's): a row redone since its eval has none.

Record fields that newer cosyclone versions add (``normalized_text``, ``stop_reason``, ``meta``)
are read by name with a fallback, so the page reads folders of every version.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cosyclone.folder.layout import iter_jsonl
from cosyclone.folder.row_record import RowRecord
from cosyclone.folder.scores import scores_path

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: sampler counters the page counts as events: (record field, label)
SAMPLER_EVENTS: tuple[tuple[str, str], ...] = (
    ("nan_steps", "NaN"),
    ("all_nan_steps", "all-NaN"),
    ("posinf_steps", "+inf"),
    ("no_finite_steps", "no finite logit"),
    ("ras_fallbacks", "RAS fallback"),
)
CAP_REASON = "max_len"  # the talker's stop reason of a segment cut at its token cap
END_OF_PROMPT = "<|endofprompt|>"  # what precedes it in a segment's text is an instruction, not spoken
TAG = re.compile(r"<\|[^|<>]*\|>")  # the LLM's control tags (<|en|>, <|endofprompt|>, <|breath|> ...)
STAGES = ("frontend", "talker", "flow", "hift")  # the per-row seconds the engine records, in path order


@dataclass(frozen=True)
class EvalFigures:
    """What eval measured of one row (the attempt on disk)."""

    error_rate: float | None  # WER for space-delimited languages, else CER
    wer: float | None  # word error rate
    cer: float | None  # character error rate
    similarity: float | None  # speaker similarity to the prompt (the first backend eval ran)
    dnsmos: float | None  # DNSMOS P.835 overall quality (OVRL, 1..5)
    transcript: str  # what the ASR heard
    fails: tuple[str, ...]  # why it failed eval's thresholds, one entry per threshold


@dataclass(frozen=True)
class EvalTable:
    """A folder set's eval records by id, and the speaker backend whose similarity the page shows."""

    rows: dict[str, EvalFigures]  # id -> figures
    backend: str | None  # the similarity's speaker backend (None: no similarity)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(float(value)) else None


def read_eval(folders: Sequence[Path], records: Mapping[str, RowRecord]) -> EvalTable:
    """Eval's records of ``folders`` (later folders win an id) for the attempts the records name."""
    rows: dict[str, EvalFigures] = {}
    backend: str | None = None
    for folder in folders:
        for obj in iter_jsonl(scores_path(Path(folder))):  # scores.jsonl, else an older eval.jsonl
            rid = obj.get("id")
            rec = records.get(rid) if isinstance(rid, str) else None
            if rec is None or obj.get("status") != "ok" or obj.get("seed") not in (None, rec.seed):
                continue
            sims = obj.get("speaker_similarity")
            sims = sims if isinstance(sims, dict) else {}
            if backend is None and sims:
                backend = str(next(iter(sims)))
            fails = obj.get("fails")
            rows[rec.id] = EvalFigures(
                error_rate=_num(obj.get("error_rate")),
                wer=_num(obj.get("wer")),
                cer=_num(obj.get("cer")),
                similarity=_num(sims.get(backend)) if backend else None,
                dnsmos=_num(obj.get("dnsmos_ovrl")),
                transcript=str(obj.get("transcript") or ""),
                fails=tuple(
                    str(x)
                    for x in (
                        fails.values()
                        if isinstance(fails, dict)
                        else fails
                        if isinstance(fails, list)
                        else ()
                    )
                ),
            )
    return EvalTable(rows=rows, backend=backend)


def normalized_text(rec: RowRecord) -> str:
    """What the LLM read: the record's ``normalized_text`` where written, else its segments' texts."""
    text = getattr(rec, "normalized_text", None)
    if isinstance(text, str) and text:
        return text
    return " ".join(s.text for s in rec.segments)


def stop_reason(rec: RowRecord) -> str:
    """The row's stop reason(s): the record's ``stop_reason`` where written, else its segments' joined."""
    reason = getattr(rec, "stop_reason", None)
    if isinstance(reason, str) and reason:
        return reason
    return ", ".join(dict.fromkeys(rec.stop_reasons)) or "-"


def chars_of(text: str) -> int:
    """Characters that take time to say: every character but white space and the LLM's ``<|tags|>``."""
    return len("".join(TAG.sub("", text).split()))


def spoken_text(rec: RowRecord) -> str:
    """The normalized text the audio says: each segment's text after its instruction prefix (what
    ``cross_lingual`` and ``instruct2`` put before ``<|endofprompt|>``), else the manifest's text."""
    spoken = " ".join(s.text.rsplit(END_OF_PROMPT, 1)[-1] for s in rec.segments)
    return spoken if spoken.strip() else rec.text


@dataclass
class Figures:
    """Every row's figures as columns (index i is ``records[i]``); NaN where a row has no such figure."""

    records: list[RowRecord]  # the merged current records, ok rows first then failed, each by id
    ok: npt.NDArray[np.bool_]  # the row was written ok
    duration: FloatArray  # seconds of audio the model made
    chars_per_s: FloatArray  # non-space characters of the normalized text per second of audio
    tokens_per_text_token: FloatArray  # speech tokens per target text token
    capped: npt.NDArray[np.bool_]  # a segment stopped at the token cap
    events: dict[str, IntArray]  # sampler counter -> that counter summed over the row's segments
    stage_seconds: dict[str, FloatArray]  # stage -> the row's wall seconds in it
    error_rate: FloatArray  # eval's WER/CER (NaN: not scored)
    similarity: FloatArray  # eval's speaker similarity (NaN: not scored)
    dnsmos: FloatArray  # eval's DNSMOS OVRL (NaN: not scored)
    evals: EvalTable = field(default_factory=lambda: EvalTable({}, None))  # eval's figures by id

    @property
    def event_total(self) -> IntArray:
        """Sampler events of each row, all kinds together."""
        total = np.zeros(len(self.records), dtype=np.int64)
        for counts in self.events.values():
            total += counts
        return total

    @property
    def has_eval(self) -> bool:
        return bool(np.isfinite(self.error_rate).any() or np.isfinite(self.similarity).any()
                    or np.isfinite(self.dnsmos).any())


def measure(records: Iterable[RowRecord], evals: EvalTable) -> Figures:
    """The columns of ``records`` (one pass), eval's figures joined by id."""
    recs = sorted(records, key=lambda r: (not r.ok, r.id))
    n = len(recs)
    nan = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    duration, rate, ratio = nan.copy(), nan.copy(), nan.copy()
    err, sim, mos = nan.copy(), nan.copy(), nan.copy()
    capped = np.zeros(n, dtype=bool)
    events = {name: np.zeros(n, dtype=np.int64) for name, _ in SAMPLER_EVENTS}
    stages: dict[str, FloatArray] = {s: nan.copy() for s in STAGES}
    for i, rec in enumerate(recs):
        ok[i] = rec.ok
        for name, _ in SAMPLER_EVENTS:
            events[name][i] = sum(int(getattr(s, name)) for s in rec.sampler)
        for stage, seconds in rec.seconds.items():
            if stage not in stages:
                stages[stage] = nan.copy()
            stages[stage][i] = float(seconds)
        capped[i] = CAP_REASON in rec.stop_reasons
        if not rec.ok:
            continue
        seconds = rec.duration or rec.audio_seconds  # the file's (after --trim-silence), as every figure
        duration[i] = seconds
        if seconds > 0:
            rate[i] = chars_of(spoken_text(rec)) / seconds
        text_ids = sum(s.text_ids for s in rec.segments)
        if text_ids > 0 and rec.tokens:
            ratio[i] = sum(rec.tokens) / text_ids
        scored = evals.rows.get(rec.id)
        if scored is not None:
            err[i] = np.nan if scored.error_rate is None else scored.error_rate
            sim[i] = np.nan if scored.similarity is None else scored.similarity
            mos[i] = np.nan if scored.dnsmos is None else scored.dnsmos
    stages = {k: v for k, v in stages.items() if np.isfinite(v).any()}
    return Figures(
        records=recs,
        ok=ok,
        duration=duration,
        chars_per_s=rate,
        tokens_per_text_token=ratio,
        capped=capped,
        events=events,
        stage_seconds=stages,
        error_rate=err,
        similarity=sim,
        dnsmos=mos,
        evals=evals,
    )
