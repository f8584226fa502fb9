"""What made the row a trace replays: its record and its run's options, or a manifest line.

From a folder, everything comes from what the run wrote: the row's record in ``diagnostics.jsonl``
(texts, prompt, mode, speed, the seed as used) and its run's line in ``runs.jsonl`` (every option
as resolved, the model directory, the output's format), so the replay runs under exactly what made
the row. From a manifest, the line is read and validated as ``synth`` reads it and the options are
the command's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.folder.current import current_records
from cosyclone.folder.row_record import RowRecord
from cosyclone.manifest import ManifestRow, read_manifest
from cosyclone.manifest.rows import check_id
from cosyclone.options import FolderOptions, RunOptions, build


@dataclass(frozen=True)
class TraceInput:
    """A row to replay and everything that made it."""

    row: ManifestRow  # the row (seed as used when it comes from a record)
    opts: RunOptions  # the run's options (resolved ones from a record)
    model_dir: str | None  # the model directory (None: dummy weights)
    record: RowRecord | None  # the row's record (None: from a manifest)
    audio_file: Path | None  # the file the record vouches for (None: none)
    output: AudioOutput  # how the run wrote its files (the replay's audio is compared after the same steps)
    records: tuple[RowRecord, ...]  # every record of the folder (who shares the prompt or text)
    trace_path: Path  # where the trace is written


def from_folder(out: Path, row_id: str, *, model_dir: Path | None, device: str | None,
                threads: int | None) -> TraceInput:
    """The row ``row_id`` of run folder ``out``, under its run's options and the CPU threads its record
    says it ran with (``device``/``threads``: where this replay runs, when not the recorded device;
    ``model_dir``: the model, when it has moved)."""
    if not runfolder.record_sources(out) and not runfolder.state_dir(out).is_dir():
        raise CosycloneError(f"{out}: not a run folder (no {runfolder.DIAG_NAME})")
    bad = check_id(row_id)
    if bad is not None:  # the id names the trace's file: a manifest's rule
        raise CosycloneError(f"row id {row_id!r} {bad}: no row of a run folder has it")
    records = current_records(out)
    rec = records.get(row_id)
    if rec is None:
        raise CosycloneError(f"{out}: no record of row {row_id!r} ({len(records)} rows recorded)")
    run = _run_line(out, rec.run_id)
    values: dict[str, Any] = {k: v for k, v in run.get("options", {}).items() if k in _RUN_FIELDS}
    if device is not None:
        values["device"] = device
    if threads is not None:
        values["threads"] = threads
    elif rec.threads is not None and rec.threads.isdigit():  # the threads it ran with: CPU sums split by them
        values["threads"] = int(rec.threads)
    opts = build(RunOptions, values)
    folder_values = {k: v for k, v in run.get("output", {}).items() if k in _FOLDER_FIELDS}
    tagged = run.get("output", {}).get("provenance_tag", False)  # the statement its files carry, if any
    statement = (run.get("provenance") or {}).get("statement") if tagged else None
    output = AudioOutput.of(build(FolderOptions, folder_values), statement)
    model = str(model_dir) if model_dir is not None else run.get("model_dir")
    row = ManifestRow(line=rec.line, id=rec.id, prompt_audio=Path(rec.prompt_audio),
                      prompt_text=rec.prompt_text, text=rec.text, mode=rec.mode, instruct=rec.instruct,
                      seed=rec.seed, speed=rec.speed)
    if not row.prompt_audio.is_file():
        raise CosycloneError(f"row {row_id!r}: its prompt recording {row.prompt_audio} is gone")
    return TraceInput(row=row, opts=opts, model_dir=model, record=rec, output=output,
                      audio_file=runfolder.audio_path(out, rec), records=tuple(records.values()),
                      trace_path=folder_trace_dir(out) / f"{row_id}.jsonl")


def folder_trace_dir(out: Path) -> Path:
    """Where a folder's traces go: ``OUT/traces/``, or the current directory's ``traces/`` when the folder
    cannot be written (a read-only mount, another user's folder: a trace only reads the folder)."""
    own = out / "traces"
    return own if runfolder.writable(own if own.is_dir() else out) else Path("traces") / out.resolve().name


def from_manifest(manifest: Path, row_id: str, *, model_dir: Path | None, opts: RunOptions,
                  trace_dir: Path) -> TraceInput:
    """Line ``row_id`` of ``manifest``, validated as ``synth`` validates it, under ``opts``."""
    if not manifest.is_file():
        raise CosycloneError(f"{manifest}: no such manifest")
    read = read_manifest(manifest, text_frontend=opts.text_frontend)
    row = next((r for r in read.rows if r.id == row_id), None)
    if row is None:
        bad = next((e for e in read.errors if e.row_id == row_id), None)
        raise CosycloneError(str(bad) if bad is not None else f"{manifest}: no row with id {row_id!r}")
    model = str(model_dir) if model_dir is not None else None
    return TraceInput(row=row, opts=opts, model_dir=model, record=None, audio_file=None, output=AudioOutput(),
                      records=(), trace_path=trace_dir / f"{row_id}.jsonl")


_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(RunOptions))
_FOLDER_FIELDS = frozenset(f.name for f in dataclasses.fields(FolderOptions))


def _run_line(out: Path, run_id: str | None) -> dict[str, Any]:
    """The ``runs.jsonl`` line of the run that made a row (its options)."""
    lines = [obj for obj in runfolder.iter_jsonl(out / runfolder.RUNS_NAME) if isinstance(obj, dict)]
    found = next((obj for obj in reversed(lines) if obj.get("run_id") == run_id), None)
    if found is None:
        raise CosycloneError(f"{out}: the run {run_id!r} that made the row is not in {runfolder.RUNS_NAME}; "
                             "trace it from its manifest line instead (cosyclone trace MANIFEST --id ID)")
    return found
