"""``cosyclone make-tiny-model`` and ``cosyclone inspect``: a model directory written or checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cosyclone.commands.common import fail
from cosyclone.errors import CosycloneError, Exit


def make_tiny_model_command(
    directory: Path = typer.Argument(..., help="the folder to write", show_default=False),
    **options: Any,
) -> None:
    """Write a complete tiny model directory in the released layout."""
    from cosyclone.engine.tiny import make_tiny_model

    if directory.exists() and any(directory.iterdir()) and not options["force"]:
        fail(f"{directory} exists and is not empty (use --force)")
    make_tiny_model(directory, rl_talker=options["rl_talker"])
    typer.echo(f"tiny model written to {directory}")


def inspect_command(model_dir: Path = typer.Argument(...), **options: Any) -> None:
    """Geometry, parameter counts, key check against the expected layout, device, providers and
    the text normalizers. Exits 2 when a checkpoint does not match, a stage module or a required
    package does not import."""
    from cosyclone.base.device import resolve
    from cosyclone.engine import inspect as model_check
    from cosyclone.model.config import load_model_config
    from cosyclone.options import ModelOptions, check

    try:
        check(ModelOptions(llm=options["llm"]))  # a file inside the folder, as a run takes it
        cfg = load_model_config(model_dir)
        policy = resolve(options["device"], options["dtype"])
    except CosycloneError as exc:
        fail(str(exc))
    for line in model_check.geometry_lines(model_dir, cfg, policy):
        typer.echo(line)
    typer.echo(model_check.talker_line(model_dir, options["llm"]))
    bad = False
    for line, ok in model_check.environment_checks():
        typer.echo(line)
        bad = bad or not ok
    broken = model_check.stage_import_error()
    if broken:  # a stage that does not import is a broken install, not a pass
        typer.echo(f"stage modules: NOT importable ({broken})")
        raise typer.Exit(Exit.USAGE)
    for line, ok in model_check.checkpoint_checks(model_dir, cfg, options["llm"]):
        typer.echo(line)
        bad = bad or not ok
    raise typer.Exit(Exit.USAGE if bad else Exit.OK)
