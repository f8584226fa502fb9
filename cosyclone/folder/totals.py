"""Folder totals over the row records (``summary.json``, ``cosyclone report``).

The totals depend only on the current record of each row, never on how many invocations made
them: one run, a run killed and resumed five times, or four shards merged give the same numbers.
The index (:mod:`cosyclone.folder.index`) keeps them as rows are written, so reading them costs the
same for four rows or ten million. Sampler counts are "row-steps" as in
:mod:`cosyclone.talker.diagnostics`: a ``calls_*`` total sums a counter over every segment of every
row, a ``rows_*`` total counts rows where it was non-zero.

Durations are the files' (after resampling and ``--trim-silence``), as ``metadata.jsonl`` and every
export count them. What a dataset builder must know before loading the folder is flagged: ``ok`` rows
at more than one sample rate, container or encoding (an interrupted rerun with new output options),
and, in ``cosyclone report``, a ``synth`` still writing the folder. Where the rows ran (device kind,
CPU threads, library versions) is shown as a mix: it never redoes a row, so a folder may hold several.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from cosyclone.folder import layout as runfolder
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.index_rows import (
    AUDIO_SCALE,
    FILE_SHARES,
    RAN_SHARES,
    SAMPLER_COUNTERS,
    SHARE_COLUMNS,
    add_share,
    row_values,
    share_of,
)
from cosyclone.folder.record_line import RecordLine, parse_record, why_not_a_record
from cosyclone.folder.row_record import RowRecord
from cosyclone.options import DUMMY_TALKER

#: A file property that must be one value among the ok rows for the folder to be one dataset:
#: (record field, its name in a flag, the unit its values are shown with)
FILE_PROPERTIES = (("sample_rate", "sample rates", " Hz"), ("audio_format", "formats", ""),
                   ("encoding", "encodings", ""))


def _counts(kept: Mapping[str, int], prefix: str) -> dict[str, int]:
    """The kept counters under ``prefix`` (``file:sample_rate:``, ``run:``, ...) by value, sorted."""
    return {k.removeprefix(prefix): v for k, v in sorted(kept.items()) if k.startswith(prefix) and v}


def totals_of(kept: Mapping[str, int]) -> dict[str, Any]:
    """The folder totals as ``summary.json`` and ``report`` show them, from the index's kept totals:
    done, failed by reason, NaN-row counts, the files' audio seconds, the ok rows' files by rate,
    format and encoding (``files``), where the rows ran (``ran_on``) and the ``flags`` a dataset
    builder must read first."""
    sampler: dict[str, int] = {}
    for calls, flagged in SAMPLER_COUNTERS.values():
        sampler[calls] = kept.get(f"sampler:{calls}", 0)
        if flagged:
            sampler[flagged] = kept.get(f"sampler:{flagged}", 0)
    reasons = _counts(kept, "reason:")
    audio = float(Fraction(kept.get("audio_fx", 0), AUDIO_SCALE))
    rows, done = kept.get("rows", 0), kept.get("done", 0)
    files = {field: _counts(kept, f"file:{field}:") for _, field in FILE_SHARES}
    return {
        "rows": rows, "done": done, "failed": rows - done, "failed_reasons": reasons,
        "audio_seconds": round(audio, 6), "sampler": sampler,
        "nan_summary": f"{sampler['sampler_calls']} sampler calls, {sampler['calls_all_nan']} entirely NaN",
        "nonfinite_audio_rows": kept.get("nonfinite_audio_rows", 0),
        "nonfinite_audio_samples": kept.get("nonfinite_audio_samples", 0),
        "files": files,
        "ran_on": {field: _counts(kept, f"ran:{field}:") for _, field in RAN_SHARES},
        "flags": mixed_files(files),
    }


def mixed_files(files: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One line per file property whose ok rows hold more than one value (an export refuses such a
    folder and a loader reads it as it lies, mixed)."""
    flags = []
    for name, label, unit in FILE_PROPERTIES:
        counts = files.get(name, {})
        if len(counts) > 1:
            mix = ", ".join(
                f"{n} rows at {value}{unit}" for value, n in sorted(counts.items(), key=lambda kv: -kv[1])
            )
            flags.append(f"mixed {label} among ok rows: {mix}; rerun the synth command whose files you want "
                         "to the end, so that every row is made with its output options")
    return flags


def running_writers(folders: Sequence[Path]) -> list[str]:
    """One line per live ``synth`` writing one of ``folders`` (its lock held by a live process): the
    folder's figures are a moment of a run in progress."""
    from cosyclone.folder.lock import live_writers

    flags = []
    for folder in folders:
        for info in live_writers(folder):
            flags.append(f"{folder} is being written by a running synth (pid {info.get('pid')} on "
                         f"{info.get('host')}, shard {info.get('shard')}): these figures will change")
    return flags


def versions_mix(folders: Sequence[Path], totals: Mapping[str, Any]) -> dict[str, int]:
    """Rows by the library versions of the run that made them (``runs.jsonl`` by ``run_id``), as
    ``cosyclone 0.4, torch 2.5.1, ...`` -> rows, from the kept rows per run (``totals["runs"]``); rows
    of a run no ``runs.jsonl`` line names, or of no run, count under ``unknown``."""

    def label(run: Mapping[str, Any]) -> str | None:
        found = run.get("versions")
        return ", ".join(f"{k} {v}" for k, v in sorted(found.items())) if isinstance(found, dict) else None

    return _rows_by_run(folders, totals, label)


def talker_of(run: Mapping[str, Any]) -> str:
    """The talker a ``runs.jsonl`` line says made its rows: its ``llm`` (a run recorded before ``--llm``
    existed read ``llm.pt``), or ``dummy`` (random weights)."""
    if run.get("load_format") == "dummy":
        return DUMMY_TALKER
    return str(run.get("llm") or "llm.pt")


def talkers_mix(folders: Sequence[Path], totals: Mapping[str, Any]) -> dict[str, int]:
    """Rows by the talker file of the run that made them (``llm.pt``, ``llm.rl.pt``, ``dummy weights``):
    which talker a published figure used."""
    return _rows_by_run(folders, totals, talker_of)


def _rows_by_run(folders: Sequence[Path], totals: Mapping[str, Any],
                 label: Callable[[Mapping[str, Any]], str | None]) -> dict[str, int]:
    """The kept rows per run (``totals["runs"]``) summed by ``label`` of each run's ``runs.jsonl`` line;
    rows of a run no line names (or ``label`` gives None for), or of no run, count under ``unknown``."""
    versions: dict[str, str] = {}
    for folder in folders:
        for run in runfolder.iter_jsonl(Path(folder) / runfolder.RUNS_NAME):
            found = label(run)
            if isinstance(run.get("run_id"), str) and found is not None:
                versions[run["run_id"]] = found
    runs: Mapping[str, int] = totals.get("runs", {})
    mix: dict[str, int] = {}
    for run_id, n in runs.items():
        key = versions.get(run_id, "unknown")
        mix[key] = mix.get(key, 0) + n
    no_run = int(totals.get("rows", 0)) - sum(runs.values())
    if no_run > 0:
        mix["unknown"] = mix.get("unknown", 0) + no_run
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]))


def folder_totals(records: Iterable[RowRecord]) -> dict[str, Any]:
    """Totals over row records given one by one (the same sums the index keeps)."""
    kept: dict[str, int] = {}
    for rec in records:
        line = parse_record(rec.to_json())
        if line is not None:
            add_share(kept, share_of(row_values(line, "", 0)), +1)
    return totals_of(kept)


def open_read(folder: Path) -> FolderIndex:
    """A folder's index for reading its totals (brought up to date under the folder's settle lock)."""
    with runfolder.settle_lock(folder):
        return runfolder.open_index(folder)


def merged_totals(folders: Sequence[Path], *, runs: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The totals of several folders (shards) as one: (totals, warnings about ids in two folders).

    An id in two folders counts once, by its later attempt (``finished_at``; a tie goes to the folder
    named later); only the ids the folders share are read, each pair of folders joined in SQLite.
    With ``runs``, the totals carry ``runs`` (rows per ``run_id``) for :func:`versions_mix`.
    """
    # a folder without records adds 0
    folders = [f for f in folders if runfolder.record_sources(f)]
    indexes: list[FolderIndex] = []
    try:
        for f in folders:
            indexes.append(open_read(f))
    except (OSError, sqlite3.Error):  # OutputFolderError included: a folder this user cannot write
        for idx in indexes:
            idx.close()
        return streamed_totals(folders, runs=runs)
    try:
        kept: dict[str, int] = {}
        for idx in indexes:
            for k, v in idx.totals().items():
                kept[k] = kept.get(k, 0) + v
        warnings: list[str] = []
        for i, a in enumerate(indexes):
            losers: dict[str, Sequence[Any]] = {}
            for j, b in enumerate(indexes):
                if i == j:
                    continue
                for rid, mine, theirs, share in _shared(a, b):
                    if i < j:
                        warnings.append(
                            f"row {rid!r} is in {folders[i]} and {folders[j]}: the later attempt counts"
                        )
                    if theirs > mine or (theirs == mine and j > i):
                        losers[rid] = share
            for share in losers.values():
                add_share(kept, share, -1)
        totals = totals_of(kept)
        if runs:
            totals["runs"] = _counts(kept, "run:")
        return totals, [line for idx in indexes for line in idx.corrupt_lines()] + warnings
    finally:
        for idx in indexes:
            idx.close()


def _lines(path: Path, corrupt: list[str]) -> Iterable[RecordLine]:
    """The records of a records file, a line at a time (:func:`parse_record`); each whole line that is not
    a record is named in ``corrupt`` (a torn last line, from a kill, is not)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below, the generator's whole life)
    except FileNotFoundError:
        return
    with fh:
        offset = 0
        for number, raw in enumerate(fh, 1):
            here, offset = offset, offset + len(raw)
            rec = parse_record(raw)
            if rec is not None:
                yield rec
            elif raw.endswith(b"\n") and raw.strip():
                corrupt.append(f"{path} line {number} (byte {here}): {why_not_a_record(raw)}, not a record; "
                               "that row is left out until it is fixed")


def streamed_totals(folders: Sequence[Path], *, runs: bool = False) -> tuple[dict[str, Any], list[str]]:
    """:func:`merged_totals` without an index: one streaming pass over each folder's records files, for a
    folder that cannot be written (a read-only mount, another user's); holds a row's share per id."""
    best: dict[str, tuple[float, Sequence[Any]]] = {}
    owner: dict[str, int] = {}
    warnings: list[str] = []
    corrupt: list[str] = []
    for i, folder in enumerate(folders):
        mine: dict[str, tuple[float, Sequence[Any]]] = {}
        for name in runfolder.record_sources(folder):
            for rec in _lines(Path(folder) / name, corrupt):
                values = row_values(rec, name, 0)
                if values[0] not in mine or values[8] >= mine[values[0]][0]:
                    mine[values[0]] = (values[8], share_of(values))
        for rid, (finished, share) in mine.items():
            if rid in best:
                warnings.append(
                    f"row {rid!r} is in {folders[owner[rid]]} and {folder}: the later attempt counts"
                )
                if finished < best[rid][0]:
                    continue
            best[rid], owner[rid] = (finished, share), i
    kept: dict[str, int] = {}
    for _, share in best.values():
        add_share(kept, share, +1)
    totals = totals_of(kept)
    if runs:
        totals["runs"] = _counts(kept, "run:")
    return totals, corrupt + warnings


def _shared(a: FolderIndex, b: FolderIndex) -> Iterable[tuple[str, float, float, Sequence[Any]]]:
    """(id, finished_at in a, finished_at in b, a's share) of every id both folders hold."""
    db = sqlite3.connect(a.path)
    try:
        db.execute("ATTACH DATABASE ? AS other", (str(b.path),))
        cols = ", ".join(f"r.{c}" for c in SHARE_COLUMNS)
        for row in db.execute(f"SELECT r.id, r.finished_at, o.finished_at, {cols} FROM main.rows r "
                              "JOIN other.rows o ON o.id = r.id"):
            yield row[0], row[1], row[2], row[3:]
    finally:
        db.close()


TABLE_ROWS = (
    ("rows", "rows"),
    ("done", "done"),
    ("failed", "failed"),
    ("failed_reasons", "failed by reason"),
    ("audio_seconds", "audio s (files)"),
    ("nan_summary", "sampler"),
)


def render(
    totals: Mapping[str, Any], *, title: str, tty: bool, extra: Mapping[str, Any] | None = None
) -> None:
    """A rich table on a terminal; plain ``label: value`` lines otherwise (logs grep well)."""
    lines = [("warning", flag) for flag in totals.get("flags", ())]
    lines += [(label, _fmt(totals.get(key))) for key, label in TABLE_ROWS]
    for group in ("files", "ran_on"):
        lines += [(k.replace("_", " "), _fmt(v)) for k, v in totals.get(group, {}).items() if len(v) > 1]
    if totals.get("talkers"):  # which talker made the rows: asked of every published figure
        lines.append(("talkers", "; ".join(f"{n} rows: {v}" for v, n in totals["talkers"].items())))
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
