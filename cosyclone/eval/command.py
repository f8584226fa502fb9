"""The ``cosyclone eval`` command (registered in cosyclone/cli.py; the work is in evaluate.py).

Exit codes follow ``synth``: 0 = every scored row passes the thresholds (or none were given);
3 = some rows fail a threshold (they are in redo.jsonl) or could not be scored; 2 = unusable input
(folder, manifest or model missing, the eval extra not installed, bad options). A nightly job can
therefore loop ``synth -> eval -> synth OUT/redo.jsonl`` until eval exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from cosyclone.errors import CosycloneError, Exit


def eval_command(
    out: Path = typer.Argument(..., help="synthesis output folder (holds wavs/ and diagnostics.jsonl)"),
    manifest: Path = typer.Option(..., "--manifest", help="the manifest the folder was synthesized from"),
    asr_model: str | None = typer.Option(None, "--asr-model", envvar="COSYCLONE_ASR_MODEL",
                                         help="local CTranslate2 Whisper directory (e.g. a large-v3 conversion)"),
    asr_download: bool = typer.Option(False, "--asr-download",
                                      help="allow --asr-model to name a model that faster-whisper downloads"),
    language: str | None = typer.Option(None, help="force one language for every row (default: from the "
                                                   "row's text, else detected by the ASR)"),
    asr_device: str = typer.Option("auto", help="auto | cpu | cuda (CTranslate2)"),
    compute_type: str = typer.Option("auto", help="CTranslate2 compute type (auto: int8 on CPU, the "
                                                  "weights' precision on GPU)"),
    beam_size: int = typer.Option(5, help="ASR beam width"),
    asr_batch_size: int = typer.Option(8, help="rows per ASR call"),
    speaker_model: list[str] = typer.Option(["resemblyzer"], "--speaker-model",
                                            help="resemblyzer | campplus | none; repeat for several (the "
                                                 "first is the one --min-similarity reads)"),
    model_dir: Path | None = typer.Option(None, "--model-dir",
                                          help="CosyVoice3 model directory (campplus.onnx for --speaker-model "
                                               "campplus)"),
    max_wer: float | None = typer.Option(None, help="rows above this error rate (WER; CER for zh/ja) fail"),
    min_similarity: float | None = typer.Option(None, help="rows below this speaker similarity fail"),
    max_silence: float | None = typer.Option(None, help="rows with more leading/trailing silence (s) fail"),
    max_clipping: float | None = typer.Option(None, help="rows with a larger clipped-sample fraction fail"),
    redo_unsynthesized: bool = typer.Option(False, help="also put failed / missing rows in redo.jsonl"),
    reuse_transcripts: bool = typer.Option(True, help="reuse the previous scores.jsonl's transcript of an "
                                                      "unchanged WAV"),
) -> None:
    """Score every synthesized row of OUT (ASR WER/CER, speaker similarity, silence, clipping).

    Writes OUT/scores.jsonl (one line per row), OUT/scores_summary.json and, with a threshold,
    OUT/redo.jsonl: the failing rows with new seeds, for `cosyclone synth OUT/redo.jsonl --out OUT`.
    """
    from cosyclone.eval.asr import AsrOptions
    from cosyclone.eval.evaluate import EvalOptions, evaluate
    from cosyclone.eval.summary import render_eval_summary
    from cosyclone.eval.thresholds import Thresholds

    def fail(msg: str) -> None:
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(Exit.USAGE)

    if not asr_model:
        fail("give --asr-model DIR: a local CTranslate2 Whisper directory (see docs/eval.md); "
             "nothing is downloaded unless --asr-download is given")
    for name, value in (("--beam-size", beam_size), ("--asr-batch-size", asr_batch_size)):
        if value < 1:
            fail(f"{name} must be at least 1, not {value}")
    speakers = tuple(s for s in speaker_model if s != "none")
    options = EvalOptions(
        asr=AsrOptions(model=str(asr_model), download=asr_download, device=asr_device, compute_type=compute_type,
                       beam_size=beam_size, batch_size=asr_batch_size, language=language),
        speaker_models=speakers, model_dir=model_dir,
        thresholds=Thresholds(max_wer=max_wer, min_similarity=min_similarity, max_silence_s=max_silence,
                              max_clipped_fraction=max_clipping),
        redo_unsynthesized=redo_unsynthesized, reuse_transcripts=reuse_transcripts)
    from tqdm import tqdm

    bar = None
    try:
        from cosyclone.eval.folder import read_folder

        folder = read_folder(out, manifest)
        for err in folder.invalid:
            typer.echo(f"{manifest}: {err}", err=True)
        bar = tqdm(total=sum(1 for f in folder.rows if f.skip is None), desc="eval", unit="row",
                   disable=not sys.stderr.isatty())
        result = evaluate(out, manifest, options, progress=bar.update)
    except CosycloneError as exc:
        fail(str(exc))
        return
    finally:
        if bar is not None:
            bar.close()
    for rec in result.records:
        if rec.status == "error":
            typer.echo(f"{manifest}: line {rec.line}, row {rec.id!r}: {rec.error}", err=True)
    render_eval_summary(result.summary)
    if result.redo_path is not None:
        typer.echo(f"{len(result.redo_ids)} rows to redo: cosyclone synth {result.redo_path} --out {out}")
    bad = result.summary["failing"] or result.summary["errors"]
    raise typer.Exit(Exit.ROWS_FAILED if bad else Exit.OK)
