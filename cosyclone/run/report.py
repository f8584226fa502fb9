"""Totals of a run folder, recomputed from its row records (``summary.json`` and ``cosyclone report``).

The totals depend only on the current record of each row, never on how many invocations made
them: one run, a run killed and resumed five times, or four shards merged give the same numbers.
Sampler counts are "row-steps" as in :mod:`cosyclone.talker.diagnostics`: a ``calls_*`` total sums
a counter over every segment of every row, a ``rows_*`` total counts rows where it was non-zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cosyclone.run import folder as runfolder
from cosyclone.run.row_record import RowRecord

#: sampler counter -> (calls total name, rows total name)
SAMPLER_COUNTERS = {
    "steps": ("sampler_calls", None),
    "nan_steps": ("calls_with_nan", "rows_with_nan"),
    "all_nan_steps": ("calls_all_nan", "rows_all_nan"),
    "posinf_steps": ("calls_posinf", "rows_posinf"),
    "no_finite_steps": ("calls_no_finite", "rows_no_finite"),
    "ras_fallbacks": ("ras_fallbacks", "rows_ras_fallback"),
    "ras_sole_restores": ("ras_sole_restores", None),
}


def folder_totals(records: Iterable[RowRecord]) -> dict[str, Any]:
    """Totals over every row record: done, failed by reason, NaN-row counts, audio seconds."""
    recs = list(records)
    sampler: dict[str, int] = {}
    for calls, rows in SAMPLER_COUNTERS.values():
        sampler[calls] = 0
        if rows:
            sampler[rows] = 0
    reasons: dict[str, int] = {}
    ok = audio_rows = audio_samples = 0
    audio = 0.0
    for rec in recs:
        if rec.ok:
            ok += 1
            audio += rec.audio_seconds
        else:
            key = str(rec.reason or "unknown")
            reasons[key] = reasons.get(key, 0) + 1
        for counter, (calls, rows) in SAMPLER_COUNTERS.items():
            n = sum(int(getattr(s, counter)) for s in rec.sampler)
            sampler[calls] += n
            if rows and n:
                sampler[rows] += 1
        bad = rec.nonfinite_audio_samples
        audio_samples += bad
        audio_rows += 1 if bad else 0
    return {
        "rows": len(recs), "done": ok, "failed": len(recs) - ok, "failed_reasons": dict(sorted(reasons.items())),
        "audio_seconds": round(audio, 6), "sampler": sampler,
        "nan_summary": f"{sampler['sampler_calls']} sampler calls, {sampler['calls_all_nan']} entirely NaN",
        "nonfinite_audio_rows": audio_rows, "nonfinite_audio_samples": audio_samples,
    }


def merge_folders(folders: Sequence[Path]) -> tuple[dict[str, RowRecord], list[str]]:
    """Current records of several folders (shards): (id -> record, warnings about ids in two folders)."""
    merged: dict[str, RowRecord] = {}
    where: dict[str, Path] = {}
    warnings = []
    for folder in folders:
        for rid, rec in runfolder.read_records(folder).items():
            if rid in merged:
                warnings.append(f"row {rid!r} is in {where[rid]} and {folder}: the later attempt counts")
                if rec.finished_at < merged[rid].finished_at:
                    continue
            merged[rid], where[rid] = rec, folder
    return merged, warnings


TABLE_ROWS = (("rows", "rows"), ("done", "done"), ("failed", "failed"), ("failed_reasons", "failed by reason"),
              ("audio_seconds", "audio s"), ("nan_summary", "sampler"))


def render(totals: Mapping[str, Any], *, title: str, tty: bool, extra: Mapping[str, Any] | None = None) -> None:
    """A rich table on a terminal; plain ``label: value`` lines otherwise (logs grep well)."""
    lines = [(label, _fmt(totals.get(key))) for key, label in TABLE_ROWS]
    lines += [(k.replace("_", " "), _fmt(v)) for k, v in totals.get("sampler", {}).items()
              if k != "sampler_calls" and v]
    if totals.get("nonfinite_audio_samples"):
        lines.append(("non-finite audio", f"{totals['nonfinite_audio_rows']} rows, "
                                           f"{totals['nonfinite_audio_samples']} samples"))
    lines += [(k, _fmt(v)) for k, v in (extra or {}).items()]
    if tty:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_header=False)
        for label, value in lines:
            table.add_row(label, value)
        Console().print(table)
    else:
        print(title)
        for label, value in lines:
            print(f"  {label}: {value}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    return "" if value is None else str(value)
