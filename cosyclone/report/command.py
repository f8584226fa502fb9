"""The ``cosyclone report`` command (registered in cosyclone/cli.py, which adds the registry's options).

Exit codes follow ``synth``: 0 = the totals are shown (and the page written); 2 = unusable input
(not a folder, a bad option); 4 = the page or its redo manifest cannot be written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from cosyclone.errors import CosycloneError, Exit


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(Exit.USAGE)


def report_command(
    folders: list[Path] = typer.Argument(..., help="run folders (shards of one dataset are merged)"),
    **options: Any,
) -> None:
    """Totals of one or more run folders (shards merged), as each folder's index keeps them.

    With --html PAGE, also one self-contained page: plots, outliers, the rows to listen to (docs/output.md).
    """
    from cosyclone.eval.summary import load_eval_summary
    from cosyclone.folder import layout as runfolder
    from cosyclone.folder import totals as totals_mod
    from cosyclone.options import build
    from cosyclone.report.options import ReportOptions

    for path in folders:
        if not path.is_dir():
            _fail(f"{path}: not a folder")
        if not (runfolder.record_sources(path) or (path / runfolder.RUNS_NAME).is_file()
                or runfolder.state_dir(path).is_dir()):
            _fail(f"{path}: not a run folder (no {runfolder.DIAG_NAME}, journal or {runfolder.RUNS_NAME})")
    try:
        page: ReportOptions = build(ReportOptions, options)
    except CosycloneError as exc:
        _fail(str(exc))
    if page.html is not None:
        _write_page(folders, page.html, link_audio=page.link_audio)
    try:
        totals, warnings = totals_mod.merged_totals(folders, runs=True)
    except CosycloneError as exc:
        _fail(str(exc))
    totals["flags"] = totals_mod.running_writers(folders) + totals["flags"]
    totals["versions"] = totals_mod.versions_mix(folders, totals)
    totals["talkers"] = totals_mod.talkers_mix(folders, totals)
    totals.pop("runs", None)  # rows per run: read above as the versions' and talkers' mixes
    evals = {str(f): e for f in folders if (e := load_eval_summary(f)) is not None}
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    if page.json_out:
        typer.echo(
            json.dumps(
                {**totals, "folders": [str(f) for f in folders], "eval": evals or None}, sort_keys=True
            )
        )
        raise typer.Exit(Exit.OK)
    title = "cosyclone report: " + ", ".join(str(f) for f in folders)
    totals_mod.render(totals, title=title, tty=sys.stdout.isatty())
    if evals:
        from cosyclone.eval.summary import eval_summary_renderable

        for folder, e in evals.items():
            if sys.stdout.isatty():
                from rich.console import Console

                Console().print(eval_summary_renderable(e))
            else:
                typer.echo(f"eval of {folder}: {json.dumps(e, sort_keys=True)}")
    raise typer.Exit(Exit.OK)


def _write_page(folders: list[Path], html: Path, *, link_audio: bool) -> None:
    """``--html``: the page and its redo manifest, a line each on stderr (stdout keeps the table or JSON)."""
    from cosyclone.report.build import write_html_report

    try:
        done = write_html_report(folders, html, link_audio=link_audio)
    except CosycloneError as exc:
        _fail(str(exc))
    except OSError as exc:
        typer.echo(f"error: cannot write {html}: {exc}", err=True)
        raise typer.Exit(Exit.WRITE) from None
    for line in done.describe():
        typer.echo(line, err=True)
