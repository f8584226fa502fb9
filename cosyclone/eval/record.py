"""One line of ``scores.jsonl``: what ``cosyclone eval`` found for one manifest row, typed.

Why a frozen dataclass: the scores are read by scripts and by ``export`` (its verdict columns), so
every field is declared once, with its meaning beside it (docs/eval.md's table is generated from
these comments), written in one place (:meth:`EvalRecord.to_json`) and read in one place
(:meth:`EvalRecord.from_json`, which also reads the lines of an older ``eval.jsonl``). Every line
holds every field (null where the row has no value): one schema, so a column reader (Arrow,
pandas) sees one type per column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, cast

EvalStatus = Literal["ok", "error", "skipped"]  # scored | could not be scored | nothing to score
EVAL_STATUSES: tuple[str, ...] = ("ok", "error", "skipped")


@dataclass(frozen=True, kw_only=True)
class EvalRecord:
    """What eval found for one manifest row (the ``status`` says which fields hold values)."""

    id: str  # the manifest row's id
    line: int  # its 1-based manifest line
    status: EvalStatus
    # ok (scored) | error (its audio or a model failed: see error) | skipped (see skip_reason)
    seed: int  # the seed that made the audio (the row's record, else the manifest's, else run seed 0's)
    wav: str  # the audio file relative to the folder (wavs/<id>.wav or .flac)
    text: str  # the manifest's text (the reference the transcript is scored against)
    mode: str  # zero_shot | cross_lingual | instruct2
    prompt_audio: str  # the prompt recording the speaker similarity compares against
    skip_reason: str | None = None  # not_synthesized | synth_failed | wav_missing (status skipped)
    synth_error: str | None = None  # the synthesis error of a row skipped as synth_failed
    error: str | None = None  # why a row could not be scored (status error)
    wav_sha256: str | None = None  # the scored file's sha256 (a transcript is reused while it is unchanged)
    sample_rate: int | None = None  # the file's sample rate
    duration_s: float | None = None  # the file's duration in seconds
    lead_silence_s: float | None = None  # silence before the first loud 10 ms frame
    trail_silence_s: float | None = None  # silence after the last loud frame
    all_silent: bool | None = None  # no frame above the silence threshold
    peak: float | None = None  # the largest |sample| (finite samples)
    clipped_samples: int | None = None  # samples at or above the clip level
    clipped_fraction: float | None = None  # clipped_samples / samples
    nonfinite_samples: int | None = None  # NaN / inf samples (float files only)
    asr_key: str | None = None  # hash of the ASR model, its decoding options and the language hint
    transcript_reused: bool = False  # the transcript came from the previous scores (same file, same asr_key)
    transcript: str | None = None  # what the ASR heard
    asr_language: str | None = None  # the language the ASR decoded in
    asr_language_source: str | None = None  # how that language was chosen (forced, hint, detected)
    asr_language_probability: float | None = None  # the ASR's detection probability (detected only)
    language: str | None = None  # the language the texts were scored in
    language_source: str | None = None  # where it came from: forced, the text's script, or the ASR
    metric: str | None = None  # wer (space-separated scripts) | cer (CJK and other unspaced scripts)
    reference_norm: str | None = None  # the text as scored (normalized)
    transcript_norm: str | None = None  # the transcript as scored (normalized)
    wer: float | None = None  # word error rate (None: an empty reference)
    cer: float | None = None  # character error rate
    error_rate: float | None = None  # the rate of ``metric``: what --max-wer judges
    similarity_ratio: float | None = None  # difflib ratio of the normalized texts (1.0: identical)
    ref_words: int | None = None  # words in the normalized reference
    word_edits: int | None = None  # word edits from reference to transcript
    ref_chars: int | None = None  # characters in the normalized reference
    char_edits: int | None = None  # character edits from reference to transcript
    speaker_similarity: dict[str, float] = field(default_factory=dict)  # backend -> cosine of the prompt's
    # and the output's speaker embeddings
    dnsmos_sig: float | None = None  # DNSMOS P.835 speech signal quality (1..5)
    dnsmos_bak: float | None = None  # DNSMOS P.835 background noise (1..5, higher: less noise)
    dnsmos_ovrl: float | None = None  # DNSMOS P.835 overall quality (1..5): what --min-dnsmos judges
    dnsmos_p808: float | None = None  # DNSMOS P.808 overall MOS (1..5)
    rate_chars: int | None = None  # characters the speaking rate counts (the normalized text, no spaces)
    s_per_char: float | None = None  # seconds of speech (duration less edge silence) per character
    rate_group: str | None = None  # the rows its rate is judged against: its language (unknown: none known)
    rate_fences: list[float] | None = None  # [low, high] s_per_char of its group (Q1 - 1.5 IQR, Q3 + 1.5
    # IQR; None: too few rows or no spread)
    rate_outlier: str | None = None  # slow | fast: s_per_char outside rate_fences (None: inside, not judged)
    fails: dict[str, str] = field(default_factory=dict)  # check -> why, for every threshold the row fails
    redo_seed: int | None = None  # the seed redo.jsonl gives the row (rows it lists)
    models: dict[str, Any] | None = None  # the ASR and speaker models that scored it: paths, versions, hashes

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the row's ``scores.jsonl`` line."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EvalRecord | None:
        """A line read back (an older ``eval.jsonl``'s too: missing fields take their defaults, fields
        no version declares are dropped); None when ``obj`` is not a row's record."""
        if not isinstance(obj.get("id"), str) or obj.get("status") not in EVAL_STATUSES:
            return None
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in obj.items() if k in names and v is not None}
        values.setdefault("line", 0)
        values.setdefault("seed", -1)
        for name in ("wav", "text", "mode", "prompt_audio"):
            values.setdefault(name, "")
        values["status"] = cast(EvalStatus, obj["status"])
        return cls(**values)


def unknown_fields(obj: Mapping[str, Any]) -> list[str]:
    """The keys of ``obj`` that :class:`EvalRecord` does not declare (eval builds a record as a dict
    as it scores; each key it sets must be a declared field)."""
    names = {f.name for f in fields(EvalRecord)}
    return sorted(k for k in obj if k not in names)
