"""Pass/fail of one scored row: the user's thresholds, and the fixed reference lines the summary counts.

Only the thresholds the user gives decide which rows go to ``redo.jsonl``; each is checked against
one field of the row's eval record. The reference lines are always counted in the summary so two
folders can be compared without agreeing on thresholds first (the 0.5 error-rate line is the one
seed-tts-eval reports as "WER > 50 %").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REFERENCE_ERROR_RATE = 0.5  # rows above this error rate are counted whatever the thresholds


@dataclass(frozen=True)
class Thresholds:
    """Limits a good row stays within (None = not checked)."""

    max_wer: float | None = None  # highest error rate (WER; CER for zh/ja/yue) of a good row
    min_similarity: float | None = None  # lowest speaker similarity (cosine) of a good row
    similarity_backend: str | None = None  # backend min_similarity reads (None = the first one scored)
    max_silence_s: float | None = None  # longest leading or trailing silence of a good row
    max_clipped_fraction: float | None = None  # largest fraction of clipped samples of a good row
    min_dnsmos: float | None = None  # lowest DNSMOS OVRL of a good row
    rate_outliers: bool = False  # a good row's seconds per character lies inside its language's fences

    @property
    def any(self) -> bool:
        return self.rate_outliers or any(
            v is not None
            for v in (self.max_wer, self.min_similarity, self.max_silence_s, self.max_clipped_fraction,
                      self.min_dnsmos)
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


#: the keys failures() reports
CHECKS = ("error_rate", "speaker_similarity", "silence", "clipping", "dnsmos", "speaking_rate")


def failures(record: dict[str, Any], t: Thresholds, backend: str | None) -> dict[str, str]:
    """{check: why} for every threshold of ``t`` the scored row fails (empty when it passes).

    ``backend`` is the speaker-similarity backend ``min_similarity`` reads.
    A metric the row has no value for (an empty reference, no speaker backend) fails the threshold
    that needs it: a row that cannot be shown good is not kept as good.
    """
    out: dict[str, str] = {}
    if t.max_wer is not None:
        er = record.get("error_rate")
        if er is None or er > t.max_wer:
            out["error_rate"] = f"{record.get('metric', 'wer')} {_fmt(er)} > {t.max_wer:g}"
    if t.min_similarity is not None:
        sim = (record.get("speaker_similarity") or {}).get(backend) if backend else None
        if sim is None or sim < t.min_similarity:
            out["speaker_similarity"] = f"speaker similarity ({backend}) {_fmt(sim)} < {t.min_similarity:g}"
    if t.max_silence_s is not None:
        worst = max(float(record.get("lead_silence_s", 0.0)), float(record.get("trail_silence_s", 0.0)))
        if worst > t.max_silence_s:
            out["silence"] = f"silence {worst:.2f} s > {t.max_silence_s:g} s"
    if t.max_clipped_fraction is not None:
        clip = float(record.get("clipped_fraction", 0.0))
        if clip > t.max_clipped_fraction:
            out["clipping"] = f"clipped fraction {clip:.4f} > {t.max_clipped_fraction:g}"
    if t.min_dnsmos is not None:
        ovrl = record.get("dnsmos_ovrl")
        if ovrl is None or ovrl < t.min_dnsmos:
            out["dnsmos"] = f"DNSMOS OVRL {_fmt(ovrl)} < {t.min_dnsmos:g}"
    if t.rate_outliers and record.get("rate_outlier"):
        low, high = record.get("rate_fences") or (float("nan"), float("nan"))
        out["speaking_rate"] = (f"{record['rate_outlier']}: {_fmt(record.get('s_per_char'))} s per character "
                                f"outside {low:.3f}..{high:.3f} ({record.get('rate_group')})")
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
