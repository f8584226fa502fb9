"""The ``cosyclone`` command: synth, say, validate, eval, report, export, make-tiny-model, inspect.

Exit codes: 0 = every row done; 3 = some rows failed or were rejected by validation (the others
were produced); 2 = unusable input (manifest or model directory unreadable, bad options);
4 = the output folder cannot be written (not writable, disk full: rows finished before are kept);
5 = another ``synth`` is writing the same folder (and shard); 143 / 130 = stopped by SIGTERM / SIGINT,
the accounts written (rerun to resume). ``say`` (one utterance): 0 = WAV written; 2 = unusable input (bad
option, model directory, or the utterance rejected by validation); 3 = the utterance failed during
synthesis (no WAV); 143 / 130 = stopped by a signal (no WAV).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cosyclone.base.version import __version__
from cosyclone.cli_options import with_options
from cosyclone.errors import CosycloneError, Exit
from cosyclone.eval.command import eval_command
from cosyclone.options import (
    EVAL,
    EXPORT,
    INSPECT,
    MODEL,
    OUTPUT,
    REPORT,
    SAMPLING,
    SAY,
    SYNTH,
    VALIDATE,
    Mode,
    TextFrontendName,
)
from cosyclone.report.command import report_command
from cosyclone.run.export_command import export_command

if TYPE_CHECKING:
    from cosyclone.errors import ManifestError
    from cosyclone.run.account import JobSummary
    from cosyclone.run.job import SynthJob

OUTPUT_FIELDS = ("float_wav", "sample_rate", "audio_format", "audio_encoding", "trim_silence")  # say's file
MODEL_DIR_ENV = "COSYCLONE_MODEL_DIR"  # the default --model-dir of synth and say
app = typer.Typer(add_completion=False, help="Offline batched CosyVoice3 voice cloning.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"cosyclone {__version__}")
        raise typer.Exit(Exit.OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Offline batched CosyVoice3 voice cloning (synth: a manifest; say: one utterance)."""


MODEL_DIR_HELP = f"the model folder (or ${MODEL_DIR_ENV})"
INPUT, RUN = "Input", "Run"


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(Exit.USAGE)


TEXT_FRONTEND_HELP = ("wetext (the official normalizer: numbers, dates, units spelled out) | none (the official "
                      "code without a normalizer: inflect spells digits only)")


@app.command()
@with_options(VALIDATE)
def validate(
    manifest: Path = typer.Argument(..., help="JSONL manifest", show_default=False),
    **options: Any,
) -> None:
    """Validate a manifest (no model weights are read); exit 3 when any row is rejected.

    With --model-dir, --show-text or --json each row's text is also planned as the LLM will read
    it (normalized, split, tokenized) and checked against the model's position limit.
    """
    from cosyclone.errors import ManifestError
    from cosyclone.manifest import ManifestRow, read_manifest
    from cosyclone.manifest.options import ValidateOptions
    from cosyclone.manifest.text_check import TextCheck

    try:
        opts = ValidateOptions(**{k: v for k, v in options.items() if k != "text_frontend"})
        text_frontend: TextFrontendName = options["text_frontend"]
        model_dir, show_text, json_out = opts.model_dir, opts.show_text, opts.json_out
        planned = bool(show_text or json_out or model_dir)  # each row's text planned: normalize them all ahead
        m = read_manifest(manifest, text_frontend=text_frontend, normalize_all=planned)
        check = TextCheck(model_dir, text_frontend) if planned else None
    except CosycloneError as exc:
        _fail(str(exc))
    report = sys.stderr if json_out else sys.stdout
    if check is not None and check.stand_in:
        typer.echo("note: no --model-dir: token counts come from the built-in stand-in tokenizer (bytes, not the "
                   "model's vocabulary), so English segments can differ; give --model-dir for real counts",
                   err=True)
    entries: list[tuple[int, ManifestError | ManifestRow]] = [(e.line or 0, e) for e in m.errors]
    entries += [(r.line, r) for r in m.rows]
    rejected = len(m.errors)
    for _, item in sorted(entries, key=lambda e: e[0]):
        if not isinstance(item, ManifestRow):
            _emit_row_error(manifest, item, json_out)
            continue
        if check is None:
            continue
        try:
            plan = check.plan(item)
        except ManifestError as exc:
            rejected += 1
            _emit_row_error(manifest, exc, json_out)
            continue
        if json_out:
            typer.echo(json.dumps({"id": item.id, "mode": item.mode, "prompt_ids": list(plan.prompt_ids),
                                   "segments": [{"text": s.text, "ids": list(s.ids)} for s in plan.segments]},
                                  ensure_ascii=False))
        elif show_text:
            typer.echo(f"line {item.line}, id {item.id!r}, {item.mode}: prompt {len(plan.prompt_ids)} tokens"
                       + (f" {plan.prompt_text!r}" if plan.prompt_text else ""))
            for i, seg in enumerate(plan.segments, start=1):
                typer.echo(f"  segment {i}/{len(plan.segments)}, {len(seg.ids)} tokens: {seg.text}")
    typer.echo(f"{len(m.rows) + len(m.errors) - rejected} valid rows, {rejected} rejected", file=report)
    raise typer.Exit(Exit.ROWS_FAILED if rejected else Exit.OK)


def _emit_row_error(manifest: Path, err: ManifestError, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps({"id": err.row_id, "error": str(err)}, ensure_ascii=False))
    else:
        typer.echo(f"{manifest}: {err}")


@app.command()
@with_options(SYNTH)
def synth(
    manifest: Path = typer.Argument(..., help="JSONL manifest (docs/manifest.md)", show_default=False),
    model_dir: Path | None = typer.Option(None, "--model-dir", envvar=MODEL_DIR_ENV, help=MODEL_DIR_HELP,
                                          rich_help_panel=MODEL, show_default=False, show_envvar=False),
    out: Path = typer.Option(Path("out"), "--out", help="output folder (default: out)", rich_help_panel=OUTPUT,
                             show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and plan only", rich_help_panel=RUN),
    quiet: bool = typer.Option(False, "--quiet", help="print only the end summary and errors",
                               rich_help_panel=RUN),
    progress_interval: float = typer.Option(30.0, "--progress-interval", metavar="S",
                                            help="seconds between progress lines off a terminal",
                                            rich_help_panel=RUN, show_default=False),
    **options: Any,
) -> None:
    """Synthesize every row of MANIFEST into OUT/wavs/<id>.wav, with one record per row.

    Rerunning resumes: a finished row is skipped unless its inputs or options changed. Every option in detail: docs/cli.md.
    """
    from cosyclone.base.progress import Progress
    from cosyclone.base.stop import StopRequest, catch_signals
    from cosyclone.run.job import SynthJob

    say = (lambda msg: None) if quiet else (lambda msg: typer.echo(msg, err=True))
    if progress_interval < 0.1:
        _fail(f"--progress-interval must be at least 0.1, not {progress_interval:g}")
    try:
        job = SynthJob.open(manifest, out, model_dir=model_dir, log=say, on_rejected=_rejected(manifest),
                            plan_only=dry_run, **options)
    except CosycloneError as exc:
        _fail(str(exc))
    _announce(job, say)
    with _folder_errors():
        if dry_run:
            plan = job.plan()
            for line in (plan.line(), *plan.engine_lines):
                typer.echo(line)
            if plan.refusal:
                _fail(plan.refusal)
            raise typer.Exit(Exit.ROWS_FAILED if plan.rejected else Exit.OK)
        # SIGTERM and Ctrl-C stop the run gracefully (no new rows, those in flight get --grace seconds)
        job.stop = StopRequest(grace=job.planned.folder.grace)
        with catch_signals(job.stop, notice=True):
            summary = job.run(progress=lambda total: Progress(total, interval=progress_interval, quiet=quiet))
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


@contextmanager
def _folder_errors() -> Iterator[None]:
    """The exit code of each way a run can stop before it finishes: 5 busy, 4 unwritable, 2 unusable input."""
    from cosyclone.run.folder import OutputFolderError
    from cosyclone.run.lock import FolderBusy

    try:
        yield
    except FolderBusy as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(Exit.BUSY) from None
    except OutputFolderError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(Exit.WRITE) from None
    except CosycloneError as exc:  # the model did not load; a Ray run that lost rows
        _fail(str(exc))


def _print_summary(job: SynthJob, summary: JobSummary) -> None:
    """After the run: the rows that failed (stderr, by manifest line), the totals table, the exit code."""
    from cosyclone.run import report as totals_mod

    for r in summary.failed:  # the rows that failed after validation, by manifest line (details in diagnostics)
        typer.echo(f"{job.manifest_label}: line {r.line}, row {r.id!r}: {r.error}", err=True)
    run = summary.last_run
    extra = {"this run": f"{run.done} done, {run.failed} failed, {run.skipped} skipped, "
                         f"{run.redone} redone, {run.invalid} invalid",
             "this run audio-s/s": run.throughput_audio_s_per_s, "outputs": str(job.out)}
    stages = run.stage_seconds or {}
    if stages.get("bound_by"):  # the stage that set the pace, and the talker's time with rows but no step
        extra["bound by"] = (f"{stages['bound_by']} (talker idle with rows in its slots "
                             f"{stages['talker_idle_with_work']:.1f} s of {stages['wall']:.1f} s)")
    totals_mod.render(summary.totals, title=f"cosyclone synth: {job.out}", tty=sys.stdout.isatty(), extra=extra)
    if summary.write_error:
        typer.echo(f"error: {summary.write_error}. The {summary.written} rows written before it are kept and no "
                   "partial file is left; free space (or fix permissions) and rerun the same command to resume",
                   err=True)
        raise typer.Exit(Exit.WRITE)
    if summary.stop_line():  # after the totals, last: what a scheduler's log shows of a stopped job
        typer.echo(summary.stop_line(), err=True)
    raise typer.Exit(summary.exit_code)


@app.command()
@with_options(SAY)
def say(
    text: str = typer.Argument(..., help="the text to speak", show_default=False),
    prompt_audio: Path = typer.Option(..., "--prompt-audio", help="the voice to clone (>= 16 kHz, <= 30 s)",
                                      rich_help_panel=INPUT, show_default=False),
    prompt_text: str | None = typer.Option(None, "--prompt-text", help="its transcript (zero_shot needs it)",
                                           rich_help_panel=INPUT, show_default=False),
    mode: Mode = typer.Option("zero_shot", "--mode", help="zero_shot | cross_lingual | instruct2",
                             rich_help_panel=INPUT, metavar="MODE", show_default=False),
    instruct: str | None = typer.Option(None, "--instruct", help="the instruction (instruct2)",
                                        rich_help_panel=INPUT, show_default=False),
    seed: int | None = typer.Option(None, "--seed", min=0, help="the utterance's seed (default: derived)",
                                    rich_help_panel=SAMPLING, metavar="N", show_default=False),
    speed: float = typer.Option(1.0, "--speed", help="speaking-rate factor in [0.25, 4]", rich_help_panel=INPUT,
                                metavar="X", show_default=False),
    out: Path = typer.Option(Path("say.wav"), "-o", "--out", help="output WAV (default: say.wav)",
                             rich_help_panel=OUTPUT, show_default=False),
    model_dir: Path | None = typer.Option(None, "--model-dir", envvar=MODEL_DIR_ENV, help=MODEL_DIR_HELP,
                                          rich_help_panel=MODEL, show_default=False, show_envvar=False),
    **options: Any,
) -> None:
    """Speak one TEXT in the voice of --prompt-audio into -o OUT (try a voice before writing a manifest).

    The same engine, options and checks as synth; prints the utterance's diagnostics briefly.
    """
    from cosyclone.api import CosyClone, utterance, validate_rows
    from cosyclone.base.stop import Interrupted, StopRequest, catch_signals
    from cosyclone.errors import ManifestError
    from cosyclone.manifest import check_id
    from cosyclone.options import FolderOptions, build
    from cosyclone.run.audio_out import AudioOutput
    from cosyclone.run.writer import write_audio_atomic

    row_id = out.stem if check_id(out.stem) is None else "say"
    t0 = time.perf_counter()
    stop = StopRequest(grace=0.0)  # one utterance: a signal drops it at once
    try:
        with catch_signals(stop):
            if out.is_dir():
                raise CosycloneError(f"-o {out} is a directory; give the WAV file to write")
            row = utterance(text, prompt_audio.expanduser().resolve(), prompt_text, mode=mode, instruct=instruct,
                            seed=seed, speed=speed, id=row_id)
            output = AudioOutput.of(build(FolderOptions, {k: options.pop(k) for k in OUTPUT_FIELDS if k in options}))
            validate_rows([row], text_frontend=options.get("text_frontend", "wetext"))  # fail in seconds, not minutes
            tts = CosyClone(model_dir, **options)
            for warning in tts.warnings:
                typer.echo(f"warning: {warning}", err=True)
            if stop.signal_name is None:  # (a signal during the load: no synthesis)
                res = tts.synthesize_rows([row])[0]  # the API cleans up after a signal, then raises Interrupted
    except Interrupted as exc:
        stop.request(exc.signal_name)
    except ManifestError as exc:  # the utterance itself: name the option, not a manifest line
        flag = {"text": "TEXT", "prompt_audio": "--prompt-audio", "prompt_text": "--prompt-text",
                "mode": "--mode", "instruct": "--instruct", "seed": "--seed", "speed": "--speed"}
        _fail(f"{flag.get(exc.field or '', exc.field or 'input')}: {exc.reason}")
    except CosycloneError as exc:
        _fail(str(exc))
    if stop.signal_name is not None:  # nothing is written: the WAV is written whole, after the synthesis
        typer.echo(f"interrupted by {stop.signal_name}: no WAV written", err=True)
        raise typer.Exit(Exit[stop.signal_name])
    if not res.ok or res.audio is None:
        typer.echo(f"error: synthesis failed ({res.reason}): {res.error}", err=True)
        raise typer.Exit(Exit.ROWS_FAILED)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        written = write_audio_atomic(out, res.audio, model_rate=res.sample_rate, output=output)
    except (OSError, CosycloneError) as exc:  # disk full, no permission: nothing partial is left
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(Exit.WRITE) from None
    wall = time.perf_counter() - t0
    nan = sum(s.nan_steps for s in res.sampler)
    trimmed = (f", trimmed {written.trimmed_lead_seconds:.2f} s + {written.trimmed_trail_seconds:.2f} s"
               if output.trim_silence else "")
    typer.echo(f"wrote {out}: {written.duration:.2f} s at {written.sample_rate} Hz "
               f"({output.format}, {output.encoding}{trimmed}), {mode}, seed {res.seed}")
    typer.echo(f"  {len(res.tokens)} segment(s), tokens {list(res.tokens)}, stop {list(res.stop_reasons)}; "
               f"sampler steps {sum(s.steps for s in res.sampler)}, NaN steps {nan}, "
               f"RAS fallbacks {sum(s.ras_fallbacks for s in res.sampler)}")
    typer.echo(f"  {wall:.1f} s in all with loading; synthesis " + ", ".join(
        f"{k} {v:.2f} s" for k, v in res.seconds.items()) + f" ({tts.policy.device}, {tts.policy.dtype_name})")
    if nan:
        typer.echo(f"warning: {nan} sampler steps had NaN logits (excluded; see docs/precision.md, --dtype)", err=True)
    raise typer.Exit(Exit.OK)


app.command("eval")(with_options(EVAL)(eval_command))  # cosyclone/eval/command.py (models from the optional eval extra)
app.command("export")(with_options(EXPORT)(export_command))  # cosyclone/run/export_command.py (shards of a run folder)
app.command("report")(with_options(REPORT)(report_command))  # cosyclone/report/command.py (totals, --html)


@app.command("make-tiny-model")
def make_tiny_model_cmd(directory: Path = typer.Argument(...),
                        force: bool = typer.Option(False, help="replace an existing directory's files")) -> None:
    """Write a complete tiny model directory in the released layout."""
    from cosyclone.engine.tiny import make_tiny_model

    if directory.exists() and any(directory.iterdir()) and not force:
        _fail(f"{directory} exists and is not empty (use --force)")
    make_tiny_model(directory)
    typer.echo(f"tiny model written to {directory}")


@app.command()
@with_options(INSPECT)
def inspect(model_dir: Path = typer.Argument(...), **options: Any) -> None:
    """Geometry, parameter counts, key check against the expected layout, device, providers and
    the text normalizers. Exits 2 when a checkpoint does not match, a stage module or a required
    package does not import."""
    from cosyclone.base.device import resolve
    from cosyclone.engine import inspect as model_check
    from cosyclone.model.config import load_model_config

    try:
        cfg = load_model_config(model_dir)
        policy = resolve(options["device"], options["dtype"])
    except CosycloneError as exc:
        _fail(str(exc))
    for line in model_check.geometry_lines(model_dir, cfg, policy):
        typer.echo(line)
    bad = False
    for line, ok in model_check.environment_checks():
        typer.echo(line)
        bad = bad or not ok
    broken = model_check.stage_import_error()
    if broken:  # a stage that does not import is a broken install, not a pass
        typer.echo(f"stage modules: NOT importable ({broken})")
        raise typer.Exit(Exit.USAGE)
    for line, ok in model_check.checkpoint_checks(model_dir, cfg):
        typer.echo(line)
        bad = bad or not ok
    raise typer.Exit(Exit.USAGE if bad else Exit.OK)


if __name__ == "__main__":  # pragma: no cover
    app()
