"""The eval summary: totals, means and percentiles of the row records, saved as JSON, shown as a rich table.

``load_eval_summary(out_dir)`` and :func:`eval_summary_renderable` are what ``cosyclone report``
uses to show the eval beside the synthesis totals; ``render_eval_summary`` prints it after
``cosyclone eval``. Percentiles are numpy's linear interpolation over the scored rows.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.base.atomic import write_atomic
from cosyclone.eval.thresholds import REFERENCE_ERROR_RATE, Thresholds
from cosyclone.folder.scores import SCORES_SUMMARY_NAME, scores_path

SUMMARY_NAME = SCORES_SUMMARY_NAME  # scores_summary.json (an older folder's: eval_summary.json, still read)
FORMAT = 1  # bumped when a field changes meaning
PERCENTILES = (10, 50, 90, 95)
# metric name -> record field (speaker similarities are added per backend)
METRICS = {
    "wer": "wer",
    "cer": "cer",
    "error_rate": "error_rate",
    "similarity_ratio": "similarity_ratio",
    "duration_s": "duration_s",
    "lead_silence_s": "lead_silence_s",
    "trail_silence_s": "trail_silence_s",
    "clipped_fraction": "clipped_fraction",
    "dnsmos_ovrl": "dnsmos_ovrl",
    "dnsmos_sig": "dnsmos_sig",
    "dnsmos_bak": "dnsmos_bak",
    "dnsmos_p808": "dnsmos_p808",
    "s_per_char": "s_per_char",
}


def stats(values: list[float]) -> dict[str, float | int | None]:
    """n, mean, min, max and the PERCENTILES of ``values`` (None entries when there are none)."""
    if not values:
        return {"n": 0, "mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}}
    a = np.asarray(values, dtype=np.float64)
    out: dict[str, float | int | None] = {"n": int(a.size), "mean": float(a.mean()), "min": float(a.min()),
                                          "max": float(a.max())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(a, p))
    return out


def summarize(records: list[dict[str, Any]], *, thresholds: Thresholds, backend: str | None,
              extra: dict[str, Any]) -> dict[str, Any]:
    """The summary of one eval over ``records`` (one per manifest row); ``extra`` adds run facts."""
    scored = [r for r in records if r.get("status") == "ok"]
    metrics: dict[str, Any] = {}
    for name, key in METRICS.items():
        metrics[name] = stats([float(r[key]) for r in scored if r.get(key) is not None])
    backends = sorted({b for r in scored for b in (r.get("speaker_similarity") or {})})
    for b in backends:
        metrics[f"speaker_similarity.{b}"] = stats(
            [
                float(r["speaker_similarity"][b])
                for r in scored
                if (r.get("speaker_similarity") or {}).get(b) is not None
            ]
        )
    transcribed = [r for r in scored if r.get("metric") is not None]  # none without --asr-model
    words = sum(int(r.get("ref_words", 0)) for r in transcribed if r.get("metric") == "wer")
    chars = sum(int(r.get("ref_chars", 0)) for r in transcribed)
    pooled = {"wer": sum(int(r.get("word_edits", 0)) for r in transcribed if r.get("metric") == "wer") / words
              if words else None,
              "cer": sum(int(r.get("char_edits", 0)) for r in transcribed) / chars if chars else None}
    t = thresholds
    labels = {
        "error_rate": (t.max_wer, f"error_rate > {t.max_wer:g}" if t.max_wer is not None else ""),
        "speaker_similarity": (
            t.min_similarity,
            f"speaker_similarity.{backend} < {t.min_similarity:g}" if t.min_similarity is not None else "",
        ),
        "silence": (
            t.max_silence_s,
            f"silence > {t.max_silence_s:g} s" if t.max_silence_s is not None else "",
        ),
        "clipping": (
            t.max_clipped_fraction,
            f"clipped_fraction > {t.max_clipped_fraction:g}" if t.max_clipped_fraction is not None else "",
        ),
        "dnsmos": (t.min_dnsmos, f"dnsmos_ovrl < {t.min_dnsmos:g}" if t.min_dnsmos is not None else ""),
        "speaking_rate": (True if t.rate_outliers else None, "s_per_char outside its language's fences"),
    }
    over = {label: sum(1 for r in scored if check in (r.get("fails") or {}))
            for check, (limit, label) in labels.items() if limit is not None}
    high_rate = f"error_rate > {REFERENCE_ERROR_RATE:g}"
    flags = {high_rate: sum(1 for r in transcribed if (r.get("error_rate") or 0.0) > REFERENCE_ERROR_RATE),
             "transcript not exact (similarity_ratio < 1)": sum(1 for r in transcribed
                                                                if (r.get("similarity_ratio") or 0.0) < 1.0),
             "all silent": sum(1 for r in scored if r.get("all_silent")),
             "any clipped sample": sum(1 for r in scored if int(r.get("clipped_samples", 0)) > 0),
             "speaking rate outside its language's fences": sum(1 for r in scored if r.get("rate_outlier"))}
    if not transcribed:
        del flags[high_rate], flags["transcript not exact (similarity_ratio < 1)"]
    skipped = Counter(str(r.get("skip_reason")) for r in records if r.get("status") == "skipped")
    return {
        "format": FORMAT,
        "rows": len(records), "scored": len(scored), "skipped": dict(sorted(skipped.items())),
        "errors": sum(1 for r in records if r.get("status") == "error"),
        "failing": sum(1 for r in scored if r.get("fails")),
        "languages": dict(sorted(Counter(str(r.get("language")) for r in scored).items())),
        "metrics": metrics, "pooled": pooled,
        "thresholds": t.to_dict(), "similarity_backend": backend, "over_threshold": over, "flags": flags,
        **extra,
    }


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    """Write ``OUT/scores_summary.json`` atomically."""
    path = Path(out_dir) / SUMMARY_NAME
    text = json.dumps(summary, indent=2, ensure_ascii=False, sort_keys=False) + "\n"
    write_atomic(path, text.encode("utf-8"))
    return path


def load_eval_summary(out_dir: str | Path) -> dict[str, Any] | None:
    """The folder's eval summary, or None when it has none (or one this version cannot read)."""
    path = scores_path(Path(out_dir), SUMMARY_NAME)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data


def _cell(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def _label(metric: str) -> str:
    """Table label of a summary metric (speaker_similarity.campplus -> speaker sim campplus)."""
    if metric.startswith("speaker_similarity."):
        return "spk sim " + metric.split(".", 1)[1]
    return {"similarity_ratio": "transcript ratio", "clipped_fraction": "clipped %"}.get(
        metric, metric.replace("_", " ")
    )


def eval_summary_renderable(summary: dict[str, Any]) -> Any:
    """A rich renderable of ``summary``: the metric table and the rows over each threshold."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    skipped = sum(summary.get("skipped", {}).values())
    title = (f"eval: {summary.get('scored', 0)} of {summary.get('rows', 0)} rows scored"
             + (f", {skipped} skipped" if skipped else "") + (f", {summary['errors']} errors"
                                                                if summary.get("errors") else ""))
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    for col in ("rows", "mean", *(f"p{p}" for p in PERCENTILES), "max"):  # min: in the JSON
        table.add_column(col, justify="right", no_wrap=True)
    for name, st in summary.get("metrics", {}).items():
        if not st.get("n"):
            continue
        scale = 100.0 if name == "clipped_fraction" else 1.0  # shown in percent: 0.0001 would not fit

        def cell(key: str, st: dict[str, Any] = st, scale: float = scale) -> str:
            v = st.get(key)
            return _cell(None if v is None else float(v) * scale)

        table.add_row(
            _label(name), str(st["n"]), cell("mean"), *(cell(f"p{p}") for p in PERCENTILES), cell("max")
        )
    pooled = summary.get("pooled", {})
    counts = Table(title="rows over threshold", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    counts.add_column("check", no_wrap=True)
    counts.add_column("rows", justify="right")
    for label, n in {**summary.get("over_threshold", {}), **summary.get("flags", {})}.items():
        counts.add_row(label, str(n))
    for name in ("wer", "cer"):
        if pooled.get(name) is not None:
            counts.add_row(f"pooled {name.upper()} (all edits / all reference units)", _cell(pooled[name]))
    for reason, n in summary.get("skipped", {}).items():
        counts.add_row(f"skipped: {reason}", str(n))
    redo = summary.get("redo")
    if redo:
        counts.add_row(f"redo: {redo.get('path')}", str(redo.get("rows")))
    return Group(table, counts)


def render_eval_summary(summary: dict[str, Any], *, console: Any = None) -> None:
    """Print the summary tables (to stdout unless a rich ``console`` is given)."""
    from rich.console import Console

    (console or Console()).print(eval_summary_renderable(summary))
