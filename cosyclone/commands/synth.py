"""``cosyclone synth``: every row of a manifest into a run folder, resumed where a run stopped."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cosyclone.commands.common import fail, folder_errors
from cosyclone.commands.options import ModelDirOptions, SynthDoorOptions
from cosyclone.errors import CosycloneError, Exit
from cosyclone.options import build

DOOR_FIELDS = tuple(f.name for f in fields(SynthDoorOptions))

if TYPE_CHECKING:
    from cosyclone.run.account import JobSummary
    from cosyclone.run.job import SynthJob


def synth_command(
    manifest: Path = typer.Argument(..., help="JSONL manifest (docs/manifest.md)", show_default=False),
    **options: Any,
) -> None:
    """Synthesize every row of MANIFEST into OUT/wavs/<id>.wav, with one record per row.

    Rerunning resumes: a finished row is skipped unless its inputs or options changed. Every option in detail:
    docs/cli.md.
    """
    from cosyclone.base.progress import Progress
    from cosyclone.base.stop import StopRequest, catch_signals
    from cosyclone.run.job import SynthJob

    try:
        where = build(ModelDirOptions, {"model_dir": options.pop("model_dir")})
        door = build(SynthDoorOptions, {k: options.pop(k) for k in DOOR_FIELDS})
    except CosycloneError as exc:
        fail(str(exc))
    model_dir, out, dry_run, quiet = where.model_dir, door.out, door.dry_run, door.quiet
    say = (lambda msg: None) if quiet else (lambda msg: typer.echo(msg, err=True))
    try:
        job = SynthJob.open(manifest, out, model_dir=model_dir, log=say, on_rejected=_rejected(manifest),
                            plan_only=dry_run, **options)
    except CosycloneError as exc:
        fail(str(exc))
    _announce(job, say)
    with folder_errors():
        if dry_run:
            plan = job.plan()
            for line in (plan.line(), *plan.engine_lines):
                typer.echo(line)
            if plan.refusal:
                fail(plan.refusal)
            raise typer.Exit(Exit.ROWS_FAILED if plan.rejected else Exit.OK)
        # SIGTERM and Ctrl-C stop the run gracefully (no new rows, those in flight get --grace seconds)
        job.stop = StopRequest(grace=job.planned.folder.grace)
        with catch_signals(job.stop, notice=True):
            summary = job.run(
                progress=lambda total: Progress(total, interval=door.progress_interval, quiet=quiet)
            )
    _print_summary(job, summary)


def _rejected(manifest: Path) -> Callable[[object], None]:
    """Each rejected manifest line on stderr (always, --quiet too), as the run reads it."""
    return lambda err: typer.echo(f"{manifest}: {err}", err=True)


def _announce(job: SynthJob, say: Callable[[str], None]) -> None:
    """Before the run: its warnings."""
    opts = job.opts
    if "legacy" in opts.nonfinite_policy or "legacy" in opts.draw:
        say("warning: LEGACY sampler behaviour requested (official, pre-fix); diagnostics are labelled")
    if opts.nonfinite_audio == "zero":
        say("warning: --nonfinite-audio zero: NaN/inf audio samples are written as 0/+-1 (LEGACY); "
            "counted per row (nonfinite_audio_samples)")
    for warning in job.policy.warnings:
        say(f"warning: {warning}")


def _print_summary(job: SynthJob, summary: JobSummary) -> None:
    """After the run: the rows that failed (stderr, by manifest line), the totals table, the exit code."""
    from cosyclone.folder import totals as totals_mod

    # the rows that failed after validation, by manifest line (details in diagnostics)
    for r in summary.failed:
        typer.echo(f"{job.manifest_label}: line {r.line}, row {r.id!r}: {r.error}", err=True)
    run = summary.last_run
    extra = {"this run": f"{run.done} done, {run.failed} failed, {run.skipped} skipped, "
                         f"{run.redone} redone, {run.invalid} invalid",
             "this run audio-s/s": run.throughput_audio_s_per_s, "outputs": str(job.out)}
    stages = run.stage_seconds or {}
    if stages.get("bound_by"):  # the stage that set the pace, and the talker's time with rows but no step
        shares = ", ".join(f"{k} {float(v):.0%}" for k, v in (stages.get("shares") or {}).items())
        extra["bound by"] = (f"{stages['bound_by']} (busy of the wall: {shares}; talker idle with rows in "
                             f"its slots {stages['talker_idle_with_work']:.1f} s of {stages['wall']:.1f} s)")
    totals_mod.render(
        summary.totals, title=f"cosyclone synth: {job.out}", tty=sys.stdout.isatty(), extra=extra
    )
    if summary.write_error:
        typer.echo(
            f"error: {summary.write_error}. The {summary.written} rows written before it are kept and no "
            "partial file is left; free space (or fix permissions) and rerun the same command to resume",
            err=True,
        )
        raise typer.Exit(Exit.WRITE)
    if summary.stop_line():  # after the totals, last: what a scheduler's log shows of a stopped job
        typer.echo(summary.stop_line(), err=True)
    raise typer.Exit(summary.exit_code)
