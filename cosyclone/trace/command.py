"""The ``cosyclone trace`` command (registered in cosyclone/cli.py, which adds the option registry's
options: the run's for a manifest line, and :class:`~cosyclone.trace.options.TraceOptions`).

Two forms: ``trace OUT ROW_ID`` replays a row of a run folder under what its record and its run's
line say made it; ``trace MANIFEST --id ROW_ID --model-dir DIR`` replays a manifest line under the
options given. Exit codes: 0 = the replay ran and, from a folder, reproduced the record; 3 = it did
not reproduce the record (the trace is written all the same); 2 = unusable input.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Any, NoReturn

import typer

from cosyclone.errors import CosycloneError, Exit
from cosyclone.options import RunOptions, build
from cosyclone.trace.options import TraceOptions

MODEL_DIR_ENV = "COSYCLONE_MODEL_DIR"  # the manifest form's default model, as synth's
_TRACE_FIELDS = frozenset(f.name for f in dataclasses.fields(TraceOptions))
#: Run options that say where a folder's row is replayed, not what made it: taken from the command line.
_WHERE = ("device", "threads")


def trace_command(
    source: Path = typer.Argument(..., help="a run folder (OUT), or a manifest with --id",
                                metavar="OUT|MANIFEST", show_default=False),
    row_id: str | None = typer.Argument(None, help="the row's id in OUT", metavar="ROW_ID",
                                        show_default=False),
    **options: Any,
) -> None:
    """Replay one row eagerly and show where its numbers broke: per step the token, top candidates,
    logit range and NaN/inf counts; with --layers each layer's output. Writes OUT/traces/<id>.jsonl.

    --dtype / --nonfinite-policy replay the row a second way and name the first step where the two part.
    Walk-through: docs/diagnostics.md.
    """
    from cosyclone.trace.run import run_trace

    def fail(msg: str) -> NoReturn:
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(Exit.USAGE)

    trace_values = {k: v for k, v in options.items() if k in _TRACE_FIELDS}
    run_values = {k: v for k, v in options.items() if k not in _TRACE_FIELDS}
    try:
        topts = build(TraceOptions, trace_values)
        if source.is_dir():
            if row_id is None or topts.id is not None:
                fail(f"{source} is a run folder: give the row as "
                     f"`cosyclone trace {shlex.quote(str(source))} ROW_ID` (--id is for a manifest)")
            ignored = [k for k, v in run_values.items() if k not in _WHERE and v != _default(k)]
            for name in ignored:
                typer.echo(f"warning: --{name.replace('_', '-')} is ignored: a folder's row is replayed "
                           "under its run's options (use --dtype / --nonfinite-policy to compare)", err=True)
            where = {k: run_values[k] for k in _WHERE if run_values.get(k) not in (None, "auto")}
            found = run_trace(source, row_id, topts, model_dir=topts.model_dir, where=where, echo=typer.echo)
        else:
            if topts.id is None:
                fail(f"{source} is a manifest: name the row with --id ROW_ID")
            if row_id is not None:
                fail(f"a manifest's row is named with --id, not as a second argument ({row_id!r})")
            opts = build(RunOptions, {**run_values, "dtype": topts.dtype or "auto",
                                      "nonfinite_policy": topts.nonfinite_policy or "exclude"})
            env = os.environ.get(MODEL_DIR_ENV)
            model_dir = topts.model_dir or (Path(env) if env else None)
            found = run_trace(source, topts.id, topts, model_dir=model_dir, manifest_opts=opts,
                              echo=typer.echo)
    except CosycloneError as exc:
        fail(str(exc))
    raise typer.Exit(Exit.ROWS_FAILED if found.verdict.reproduced is False else Exit.OK)


def _default(name: str) -> object:
    return next(f.default for f in dataclasses.fields(RunOptions) if f.name == name)
