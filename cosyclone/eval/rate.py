"""Speaking-rate flags without ASR: each row's seconds of speech per character against its language's rows.

Why per character and per language: a row that babbles (repeats, hums, pauses) takes far longer per
character than its neighbours, one cut short far less, and no transcript is needed to see it; but a
Chinese character takes longer to say than a Latin letter, so a row is judged only against the rows
of its own language (its ``language``: forced, from the text's script or tag, else the ASR's; rows of
no known language form one group, ``unknown``). The rule is the shared one
(:mod:`cosyclone.base.fences`, which ``report --html`` screens with): outside ``Q1 - 1.5 IQR .. Q3 +
1.5 IQR`` of the group's ok rows, the row is ``slow`` or ``fast``. Characters are the text as eval
scores it (:func:`cosyclone.eval.metrics.normalize`: markup dropped, English numbers spelled out,
punctuation removed) without spaces; seconds are the file's duration less its leading and trailing
silence (which ``--max-silence`` judges on its own).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from cosyclone.base.fences import fences
from cosyclone.eval.metrics import normalize

UNKNOWN = "unknown"  # the group of rows whose language is not known


def rate_fields(text: str, language: str | None, record: dict[str, Any]) -> dict[str, Any]:
    """``rate_chars`` and ``s_per_char`` of a row whose signal checks are in ``record``."""
    chars = len("".join(normalize(text, language).split()))
    duration = record.get("duration_s")
    speech = None
    if duration is not None and not record.get("all_silent"):
        speech = float(duration) - float(record.get("lead_silence_s") or 0.0) - float(
            record.get("trail_silence_s") or 0.0)
    per_char = speech / chars if speech is not None and speech > 0 and chars > 0 else None
    return {"rate_chars": chars, "s_per_char": per_char, "rate_group": language or UNKNOWN}


def flag_rates(records: list[dict[str, Any]]) -> None:
    """Set ``rate_fences`` and ``rate_outlier`` of every ok record that has a rate, group by group."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if rec.get("status") == "ok" and rec.get("s_per_char") is not None:
            groups[str(rec.get("rate_group") or UNKNOWN)].append(rec)
    for members in groups.values():
        values = np.array([float(r["s_per_char"]) for r in members])
        f = fences(values)
        limits = f.limits()
        if limits is None:
            continue
        excess = f.excess(values)
        for rec, e in zip(members, excess.tolist(), strict=True):
            rec["rate_fences"] = [limits[0], limits[1]]
            rec["rate_outlier"] = "slow" if e > 0 else "fast" if e < 0 else None
