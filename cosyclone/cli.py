"""The ``cosyclone`` command: synth, say, validate, eval, report, export, trace, make-tiny-model, inspect.

Exit codes: 0 = every row done; 3 = some rows failed or were rejected by validation (the others
were produced); 2 = unusable input (manifest or model directory unreadable, bad options);
4 = the output folder cannot be written (not writable, disk full: rows finished before are kept);
5 = another ``synth`` is writing the same folder (and shard); 143 / 130 = stopped by SIGTERM / SIGINT,
the accounts written (rerun to resume). ``say`` (one utterance): 0 = WAV written; 2 = unusable input (bad
option, model directory, or the utterance rejected by validation); 3 = the utterance failed during
synthesis (no WAV); 143 / 130 = stopped by a signal (no WAV).
"""

from __future__ import annotations

import typer

from cosyclone.base.version import __version__
from cosyclone.cli_options import with_options
from cosyclone.commands.model import inspect_command, make_tiny_model_command
from cosyclone.commands.options import MAKE_TINY_MODEL
from cosyclone.commands.say import say_command
from cosyclone.commands.synth import synth_command
from cosyclone.commands.validate import validate_command
from cosyclone.errors import Exit
from cosyclone.eval.command import eval_command
from cosyclone.export.command import export_command
from cosyclone.options import EVAL, EXPORT, INSPECT, REPORT, SAY, SYNTH, TRACE, VALIDATE
from cosyclone.report.command import report_command
from cosyclone.trace.command import trace_command

app = typer.Typer(add_completion=False, help="Offline batched CosyVoice3 voice cloning.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"cosyclone {__version__}")
        raise typer.Exit(Exit.OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Offline batched CosyVoice3 voice cloning (synth: a manifest; say: one utterance)."""


# Every command, in --help order, with its options derived from the registry (cli_options.with_options).
COMMANDS = (
    (VALIDATE, validate_command),  # cosyclone/commands/validate.py
    (SYNTH, synth_command),  # cosyclone/commands/synth.py
    (SAY, say_command),  # cosyclone/commands/say.py
    (EVAL, eval_command),  # cosyclone/eval/command.py (models from the optional eval extra)
    (REPORT, report_command),  # cosyclone/report/command.py (totals, --html)
    (EXPORT, export_command),  # cosyclone/export/command.py (shards of a run folder)
    (TRACE, trace_command),  # cosyclone/trace/command.py (one row replayed)
    (MAKE_TINY_MODEL, make_tiny_model_command),  # cosyclone/commands/model.py
    (INSPECT, inspect_command),  # cosyclone/commands/model.py
)
for _name, _command in COMMANDS:
    app.command(_name)(with_options(_name)(_command))


if __name__ == "__main__":  # pragma: no cover
    app()
