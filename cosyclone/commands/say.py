"""``cosyclone say``: one utterance in the voice of a prompt, written as one file (try a voice before a
manifest)."""

from __future__ import annotations

import time
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

import typer

from cosyclone.commands.common import fail
from cosyclone.commands.options import ModelDirOptions, UtteranceOptions
from cosyclone.errors import CosycloneError, Exit
from cosyclone.options import build

if TYPE_CHECKING:  # annotations only (the command loads the engine's modules when it runs)
    from pathlib import Path

    from cosyclone.engine import RowResult
    from cosyclone.folder.audio_out import AudioOutput
    from cosyclone.folder.row_record import FileFacts

UTTERANCE_FIELDS = tuple(f.name for f in fields(UtteranceOptions))
OUTPUT_FIELDS = ("float_wav", "sample_rate", "audio_format", "audio_encoding", "trim_silence",
                 "no_provenance_tag")  # say's file


def say_command(
    text: str = typer.Argument(..., help="the text to speak", show_default=False),
    **options: Any,
) -> None:
    """Speak one TEXT in the voice of --prompt-audio into -o OUT (try a voice before writing a manifest).

    The same engine, options and checks as synth; prints the utterance's diagnostics briefly.
    """
    from cosyclone.api import CosyClone, utterance, validate_rows
    from cosyclone.base.stop import Interrupted, StopRequest, catch_signals
    from cosyclone.errors import ManifestError
    from cosyclone.folder.audio_out import AudioOutput
    from cosyclone.folder.fingerprint import HashCache
    from cosyclone.folder.provenance import of_model
    from cosyclone.folder.writer import write_audio_atomic
    from cosyclone.manifest import check_id
    from cosyclone.options import FolderOptions

    try:
        where = build(ModelDirOptions, {"model_dir": options.pop("model_dir")})
        said = build(UtteranceOptions, {k: options.pop(k) for k in UTTERANCE_FIELDS})
    except CosycloneError as exc:
        fail(str(exc))
    assert said.prompt_audio is not None  # required on the command line
    model_dir, out, mode = where.model_dir, said.out, said.mode
    row_id = out.stem if check_id(out.stem) is None else "say"
    t0 = time.perf_counter()
    stop = StopRequest(grace=0.0)  # one utterance: a signal drops it at once
    try:
        with catch_signals(stop):
            if out.is_dir():
                raise CosycloneError(f"-o {out} is a directory; give the WAV file to write")
            row = utterance(text, said.prompt_audio.expanduser().resolve(), said.prompt_text, mode=mode,
                            instruct=said.instruct, seed=said.seed, speed=said.speed, id=row_id)
            given = {k: options.pop(k) for k in OUTPUT_FIELDS if k in options}
            folder = build(FolderOptions, given)
            output = AudioOutput.for_file(out, folder)  # -o x.flac writes FLAC
            # fail in seconds, not minutes
            validate_rows([row], text_frontend=options.get("text_frontend", "wetext"))
            tts = CosyClone(model_dir, **options)
            if not folder.no_provenance_tag:  # the statement names the model files the engine read
                hashes = HashCache()  # the cache synth shares: a model file is hashed once
                output = replace(output, tag=of_model(tts.engine.cfg, tts.engine.opts, hashes).statement())
                hashes.save()
            for warning in tts.warnings:
                typer.echo(f"warning: {warning}", err=True)
            if stop.signal_name is None:  # (a signal during the load: no synthesis)
                # the API cleans up after a signal, then raises Interrupted
                res = tts.synthesize_rows([row])[0]
    except Interrupted as exc:
        stop.request(exc.signal_name)
    except ManifestError as exc:  # the utterance itself: name the option, not a manifest line
        flag = {"text": "TEXT", "prompt_audio": "--prompt-audio", "prompt_text": "--prompt-text",
                "mode": "--mode", "instruct": "--instruct", "seed": "--seed", "speed": "--speed"}
        fail(f"{flag.get(exc.field or '', exc.field or 'input')}: {exc.reason}")
    except CosycloneError as exc:
        fail(str(exc))
    if stop.signal_name is not None:  # nothing is written: the WAV is written whole, after the synthesis
        typer.echo(f"interrupted by {stop.signal_name}: no WAV written", err=True)
        raise typer.Exit(Exit[stop.signal_name])
    if not res.ok or res.audio is None:
        typer.echo(f"error: synthesis failed ({res.reason}): {res.error}", err=True)
        raise typer.Exit(Exit.ROWS_FAILED)
    try:
        written = write_audio_atomic(out, res.audio, model_rate=res.sample_rate, output=output)
    except (OSError, CosycloneError) as exc:  # disk full, no permission: nothing partial is left
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(Exit.WRITE) from None
    ran_on = f"{tts.policy.device}, {tts.policy.dtype_name}"
    _tell(out, res, written, output, mode, time.perf_counter() - t0, ran_on)
    raise typer.Exit(Exit.OK)


def _tell(out: Path, res: RowResult, written: FileFacts, output: AudioOutput, mode: str, wall: float,
          ran_on: str) -> None:
    """The utterance's lines: the file written, its tokens and sampler counters, the time it took
    (``ran_on``: device and dtype); a warning when sampler steps had NaN logits."""
    nan = sum(s.nan_steps for s in res.sampler)
    trimmed = (f", trimmed {written.trimmed_lead_seconds:.2f} s + {written.trimmed_trail_seconds:.2f} s"
               if output.trim_silence else "")
    typer.echo(f"wrote {out}: {written.duration:.2f} s at {written.sample_rate} Hz "
               f"({output.format}, {output.encoding}{trimmed}), {mode}, seed {res.seed}")
    typer.echo(f"  {len(res.tokens)} segment(s), tokens {list(res.tokens)}, stop {list(res.stop_reasons)}; "
               f"sampler steps {sum(s.steps for s in res.sampler)}, NaN steps {nan}, "
               f"RAS fallbacks {sum(s.ras_fallbacks for s in res.sampler)}")
    typer.echo(f"  {wall:.1f} s in all with loading; synthesis "
               + ", ".join(f"{k} {v:.2f} s" for k, v in res.seconds.items()) + f" ({ran_on})")
    if nan:
        typer.echo(
            f"warning: {nan} sampler steps had NaN logits (excluded; see docs/precision.md, --dtype)",
            err=True,
        )
