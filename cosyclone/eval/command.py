"""The ``cosyclone eval`` command (registered in cosyclone/cli.py; the work is in evaluate.py).

Its options are :class:`cosyclone.eval.options.ScoringOptions`' fields, given as ``**options``
by ``cli_options.with_options`` where cosyclone/cli.py registers it.

Exit codes follow ``synth``: 0 = every scored row passes the thresholds (or none were given);
3 = some rows fail a threshold (they are in redo.jsonl) or could not be scored; 2 = unusable input
(folder, manifest or model missing, the eval extra not installed, bad options). Without
``--asr-model`` everything but WER/CER is scored (it says so once). A nightly job can
therefore loop ``synth -> eval -> synth OUT/redo.jsonl`` until eval exits 0.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from cosyclone.errors import CosycloneError, Exit

if TYPE_CHECKING:
    from cosyclone.eval.evaluate import EvalOptions
    from cosyclone.eval.options import ScoringOptions


def eval_command(
    out: Path = typer.Argument(..., help="synthesis output folder (holds wavs/ and diagnostics.jsonl)",
                               show_default=False),
    **options: Any,
) -> None:
    """Score every synthesized row of OUT (WER/CER with --asr-model, DNSMOS, speaking rate, speaker
    similarity, silence, clipping).

    Writes OUT/scores.jsonl (one line per row), OUT/scores_summary.json and, with a threshold,
    OUT/redo.jsonl: the failing rows with new seeds, for `cosyclone synth OUT/redo.jsonl --out OUT`.
    """
    from cosyclone.eval.evaluate import evaluate
    from cosyclone.eval.options import ScoringOptions
    from cosyclone.eval.summary import render_eval_summary

    def fail(msg: str) -> NoReturn:
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(Exit.USAGE)

    try:
        opts = ScoringOptions(**options)
    except CosycloneError as exc:
        fail(str(exc))
    _refuse_read_only(out)
    if opts.manifest is None:
        fail("give --manifest FILE: the manifest OUT was synthesized from (its texts are the references)")
    manifest = opts.manifest
    if opts.max_wer is not None and not opts.asr_model:
        fail("--max-wer needs --asr-model DIR: a local CTranslate2 Whisper directory (see docs/eval.md); "
             "nothing is downloaded unless --asr-download is given")
    options_ = _eval_options(opts)
    if options_.asr is None:
        typer.echo("no --asr-model: WER/CER skipped (DNSMOS, speaking rate, silence, clipping and speaker "
                   "similarity are scored)", err=True)
    from tqdm import tqdm

    bar = None
    try:
        from cosyclone.eval.folder import read_folder

        folder = read_folder(out, manifest)
        for err in folder.invalid:
            typer.echo(f"{manifest}: {err}", err=True)
        bar = tqdm(total=sum(1 for f in folder.rows if f.skip is None), desc="eval", unit="row",
                   disable=not sys.stderr.isatty())
        result = evaluate(out, manifest, options_, progress=bar.update)
    except CosycloneError as exc:
        fail(str(exc))
    finally:
        if bar is not None:
            bar.close()
    for rec in result.records:
        if rec.status == "error":
            typer.echo(f"{manifest}: line {rec.line}, row {rec.id!r}: {rec.error}", err=True)
    render_eval_summary(result.summary)
    if result.redo_path is not None:
        redo, here = shlex.quote(str(result.redo_path)), shlex.quote(str(out))
        typer.echo(f"{len(result.redo_ids)} rows to redo: cosyclone synth {redo} --out {here}")
    bad = result.summary["failing"] or result.summary["errors"]
    raise typer.Exit(Exit.ROWS_FAILED if bad else Exit.OK)


def _eval_options(opts: ScoringOptions) -> EvalOptions:
    """What evaluate() takes, from the command's options (no ASR options without --asr-model)."""
    from cosyclone.eval.asr import AsrOptions
    from cosyclone.eval.evaluate import EvalOptions
    from cosyclone.eval.thresholds import Thresholds

    asr = AsrOptions(model=str(opts.asr_model), download=opts.asr_download, device=opts.asr_device,
                     compute_type=opts.compute_type, beam_size=opts.beam_size, batch_size=opts.asr_batch_size,
                     language=opts.language)
    return EvalOptions(
        asr=asr if opts.asr_model else None,
        speaker_models=opts.speakers,
        model_dir=opts.model_dir,
        thresholds=Thresholds(
            max_wer=opts.max_wer,
            min_similarity=opts.min_similarity,
            max_silence_s=opts.max_silence,
            max_clipped_fraction=opts.max_clipping,
            min_dnsmos=opts.min_dnsmos,
            rate_outliers=opts.rate_outliers,
        ),
        redo_unsynthesized=opts.redo_unsynthesized,
        reuse_transcripts=opts.reuse_transcripts,
        dnsmos=opts.dnsmos,
        language=opts.language,
    )


def _refuse_read_only(out: Path) -> None:
    """One line, before any model loads, for a folder eval cannot write its scores into."""
    from cosyclone.folder import layout as runfolder

    if out.is_dir() and not runfolder.writable(out):
        typer.echo(f"error: {out} cannot be written (a read-only folder or mount): eval writes its scores "
                   "there; report and export read such a folder as it is", err=True)
        raise typer.Exit(Exit.WRITE)
