"""Totals of a run folder, recomputed from its row records (``summary.json`` and ``cosyclone report``).

The totals depend only on the current record of each row, never on how many invocations made
them: one run, a run killed and resumed five times, or four shards merged give the same numbers.
Sampler counts are "row-steps" as in :mod:`cosyclone.talker.diagnostics`: a ``calls_*`` total sums
a counter over every segment of every row, a ``rows_*`` total counts rows where it was non-zero.

Durations are the files' (after resampling and ``--trim-silence``), as ``metadata.jsonl`` and every
export count them. What a dataset builder must know before loading the folder is flagged: ``ok`` rows
at more than one sample rate, container or encoding (an interrupted rerun with new output options),
and, in ``cosyclone report``, a ``synth`` still writing the folder. Where the rows ran (device kind,
CPU threads, library versions) is shown as a mix: it never redoes a row, so a folder may hold several.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cosyclone.run import folder as runfolder
from cosyclone.run.row_record import RowRecord

#: A file property that must be one value among the ok rows for the folder to be one dataset:
#: (record field, its name in a flag, the unit its values are shown with)
FILE_PROPERTIES = (("sample_rate", "sample rates", " Hz"), ("audio_format", "formats", ""),
                   ("encoding", "encodings", ""))

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
    """Totals over every row record: done, failed by reason, NaN-row counts, the files' audio seconds,
    the ok rows' files by rate, format and encoding (``files``), where the rows ran (``ran_on``) and
    the ``flags`` a dataset builder must read first."""
    recs = list(records)
    sampler: dict[str, int] = {}
    for calls, rows in SAMPLER_COUNTERS.values():
        sampler[calls] = 0
        if rows:
            sampler[rows] = 0
    reasons: dict[str, int] = {}
    ok = audio_rows = audio_samples = 0
    audio = 0.0
    files: dict[str, Counter[str]] = {name: Counter() for name, _, _ in FILE_PROPERTIES}
    ran_on: dict[str, Counter[str]] = {"device": Counter(), "threads": Counter()}
    for rec in recs:
        if rec.device is not None:
            ran_on["device"][rec.device] += 1
        if rec.threads is not None:
            ran_on["threads"][rec.threads] += 1
        if rec.ok:
            ok += 1
            audio += rec.duration
            for name, _, _ in FILE_PROPERTIES:
                files[name][str(getattr(rec, name))] += 1
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
        "files": {name: dict(sorted(c.items())) for name, c in files.items()},
        "ran_on": {name: dict(sorted(c.items())) for name, c in ran_on.items()},
        "flags": mixed_files(files),
    }


def mixed_files(files: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One line per file property whose ok rows hold more than one value (an export refuses such a
    folder and a loader reads it as it lies, mixed)."""
    flags = []
    for name, label, unit in FILE_PROPERTIES:
        counts = files.get(name, {})
        if len(counts) > 1:
            mix = ", ".join(f"{n} rows at {value}{unit}" for value, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            flags.append(f"mixed {label} among ok rows: {mix}; rerun the synth command whose files you want "
                         "to the end, so that every row is made with its output options")
    return flags


def running_writers(folders: Sequence[Path]) -> list[str]:
    """One line per live ``synth`` writing one of ``folders`` (its lock held by a live process): the
    folder's figures are a moment of a run in progress."""
    from cosyclone.run.lock import live_writers

    flags = []
    for folder in folders:
        for info in live_writers(folder):
            flags.append(f"{folder} is being written by a running synth (pid {info.get('pid')} on "
                         f"{info.get('host')}, shard {info.get('shard')}): these figures will change")
    return flags


def versions_mix(folders: Sequence[Path], records: Mapping[str, RowRecord]) -> dict[str, int]:
    """Rows by the library versions of the run that made them (``runs.jsonl`` by ``run_id``), as
    ``cosyclone 0.4, torch 2.5.1, ...`` -> rows; rows of a run no ``runs.jsonl`` line names count
    under ``unknown``."""
    versions: dict[str, str] = {}
    for folder in folders:
        for run in runfolder.iter_jsonl(Path(folder) / runfolder.RUNS_NAME):
            found = run.get("versions")
            if isinstance(run.get("run_id"), str) and isinstance(found, dict):
                versions[run["run_id"]] = ", ".join(f"{k} {v}" for k, v in sorted(found.items()))
    mix: Counter[str] = Counter(versions.get(rec.run_id or "", "unknown") for rec in records.values())
    return dict(mix.most_common())


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
              ("audio_seconds", "audio s (files)"), ("nan_summary", "sampler"))


def render(totals: Mapping[str, Any], *, title: str, tty: bool, extra: Mapping[str, Any] | None = None) -> None:
    """A rich table on a terminal; plain ``label: value`` lines otherwise (logs grep well)."""
    lines = [("warning", flag) for flag in totals.get("flags", ())]
    lines += [(label, _fmt(totals.get(key))) for key, label in TABLE_ROWS]
    for group in ("files", "ran_on"):
        lines += [(k.replace("_", " "), _fmt(v)) for k, v in totals.get(group, {}).items() if len(v) > 1]
    if len(totals.get("versions") or {}) > 1:  # one set is the usual case: shown by --json only
        lines.append(("versions", "; ".join(f"{n} rows: {v}" for v, n in totals["versions"].items())))
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
