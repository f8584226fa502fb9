"""One ``cosyclone trace``: find the row, replay it (twice when comparing), judge, write, print."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cosyclone.engine.runner import Engine
from cosyclone.folder.checked_read import audio_cap, read_checked
from cosyclone.options import RunOptions
from cosyclone.trace import output
from cosyclone.trace.options import TraceOptions
from cosyclone.trace.replay import Replay, load_engine, replay_row
from cosyclone.trace.source import TraceInput, from_folder, from_manifest
from cosyclone.trace.verdict import diverge, judge

MANIFEST_TRACES = Path("traces")  # where a manifest line's trace goes (the current directory's traces/)


def run_trace(source: Path, row_id: str, topts: TraceOptions, *, model_dir: Path | None,
              where: dict[str, Any] | None = None, manifest_opts: RunOptions | None = None,
              echo: Callable[[str], None] = print) -> output.Trace:
    """Trace row ``row_id`` of run folder ``source`` (or of manifest ``source`` under ``manifest_opts``),
    write its JSONL and print its table with ``echo``."""
    if manifest_opts is None:
        where = where or {}
        got = from_folder(source, row_id, model_dir=model_dir, device=where.get("device"),
                          threads=where.get("threads"))
        label = f"{source}, line {got.row.line} of its manifest"
    else:
        got = from_manifest(source, row_id, model_dir=model_dir, opts=manifest_opts,
                            trace_dir=MANIFEST_TRACES)
        label = f"{source} line {got.row.line}"
    engine = load_engine(got.model_dir, got.opts)
    first = replay_row(engine, got.row, layers=topts.layers, top=topts.top)
    audio = _recorded_audio(got)
    verdict = judge(first, got.record, got.records, audio_bytes=audio, output=got.output)
    trace = output.Trace(row_id=row_id, source=label, replay=first, verdict=verdict)
    other = _compare_options(got, first, topts) if manifest_opts is None else None
    if other is not None:
        opts, changed = other
        if opts.dtype == first.opts.dtype:  # the stages are the same: only the sampler's policy changes
            engine = Engine(engine.stages, replace(engine.opts, nonfinite_policy=opts.nonfinite_policy))
        else:
            del engine  # the first model's memory is free before the second loads
            engine = load_engine(got.model_dir, opts)
        second = replay_row(engine, got.row, layers=topts.layers, top=topts.top)
        trace = replace(trace, compare=second, compare_label=changed, divergence=diverge(first, second))
    path = output.write(trace, got.trace_path)
    for line in output.verdict_lines(trace):
        echo(line)
    for line in output.step_table(trace):
        echo(line)
    brk = verdict.talker_break
    if topts.layers and first.segments:
        seg = next((s for s in first.segments if brk is not None and s.segment == brk.segment),
                   first.segments[0])
        for line in output.layer_table(seg.layers, brk.step if brk is not None else 0):
            echo(line)
    echo(f"trace: {path}")
    return trace


def _compare_options(got: TraceInput, first: Replay, topts: TraceOptions) -> tuple[RunOptions, str] | None:
    """The second replay's options (--dtype, --nonfinite-policy) and what they change; None: none asked."""
    changes: dict[str, Any] = {}
    if topts.dtype is not None and topts.dtype != first.opts.dtype:
        changes["dtype"] = topts.dtype
    if topts.nonfinite_policy is not None and topts.nonfinite_policy != first.opts.nonfinite_policy:
        changes["nonfinite_policy"] = topts.nonfinite_policy
    if not changes:
        return None
    label = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in changes.items())
    return replace(got.opts, **changes), label


def _recorded_audio(got: TraceInput) -> bytes | None:
    """The row's file as its record allows (a regular file, no symlink, capped); None: none to compare."""
    if got.audio_file is None or got.record is None:
        return None
    try:
        return read_checked(got.audio_file, audio_cap(got.record.samples))
    except OSError:
        return None
