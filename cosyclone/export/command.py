"""The ``cosyclone export`` command (registered in cosyclone/cli.py; the work is in build.py).

Its options are :class:`cosyclone.export.options.ExportOptions`' fields, given to it as ``**options`` by
``cli_options.with_options`` where cosyclone/cli.py registers it. Exit codes are
:class:`cosyclone.errors.Exit`'s: 0 the export is in place; 2 unusable input (not a run folder, a bad
option, rows at several sample rates, duplicate ids, ``--only-passed`` without scores.jsonl, a folder
a synth is writing); 3 no row could be exported; 4 the export cannot be written; 5 another export
holds the target. Whenever it is not 0, the target keeps what it held.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cosyclone.errors import CosycloneError, Exit


def export_command(
    out: list[Path] = typer.Argument(
        ...,
        help="run folders (synth's --out; a --shard run's folders together)",
        show_default=False,
        metavar="OUT...",
    ),
    **options: Any,
) -> None:
    """Write the ok rows of OUT... as Parquet, WebDataset, NeMo or Lhotse (OUT itself is only read).

    A line per file, then the totals; the export is swapped in whole, with export.json. Details:
    docs/output.md.
    """
    from cosyclone.export.build import NothingToExport, export
    from cosyclone.export.lock import ExportBusy
    from cosyclone.export.options import ExportOptions, parse_size
    from cosyclone.folder.layout import OutputFolderError

    try:
        opts = ExportOptions(**options)
        summary = export(out, fmt=opts.format, shard_size_bytes=parse_size(opts.shard_size), to_dir=opts.to,
                         only_passed=opts.only_passed, rows_per_shard=opts.rows_per_shard, splits=opts.split,
                         include_prompt_audio=opts.include_prompt_audio, allow_running=opts.allow_running,
                         log=typer.echo)
    except CosycloneError as exc:
        typer.echo(f"error: {exc}", err=True)
        code = (Exit.BUSY if isinstance(exc, ExportBusy) else Exit.WRITE if isinstance(exc, OutputFolderError)
                else Exit.ROWS_FAILED if isinstance(exc, NothingToExport) else Exit.USAGE)
        raise typer.Exit(code) from None
    for line in summary.corrupt:
        typer.echo(f"warning: {line}", err=True)
    typer.echo(summary.describe())
    raise typer.Exit(Exit.OK)
