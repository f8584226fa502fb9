"""The ``cosyclone export`` command (registered in cosyclone/cli.py; the work is in export.py).

Exit codes follow ``synth``: 0 = the shards are written (also when no row was ok: then none is);
2 = unusable input (not a run folder, a bad option, rows at several sample rates, ``--only-passed``
without eval.jsonl); 4 = a shard cannot be written (whole shards written before stay, no partial
file is left).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from cosyclone.errors import CosycloneError

EXIT_OK, EXIT_USAGE, EXIT_WRITE = 0, 2, 4  # the same codes as cosyclone.cli


def export_command(
    out: Path = typer.Argument(..., help="the run folder (synth's --out)", show_default=False),
    fmt: str = typer.Option("parquet", "--format", metavar="FMT", help="parquet | webdataset"),
    shard_size: str = typer.Option("500MB", "--shard-size", metavar="SIZE",
                                   help="largest shard: 500MB, 2GB, 100KB or bytes"),
    to: Path | None = typer.Option(None, "--to", metavar="DIR", help="shard folder (default: OUT/export/FMT)",
                                   show_default=False),
    only_passed: bool = typer.Option(False, "--only-passed", help="only rows that passed cosyclone eval"),
) -> None:
    """Write the ok rows of OUT into Parquet or WebDataset shards (OUT itself is only read).

    A line per shard (path, rows, bytes), then the totals; rerunning rewrites the shards.
    Details: docs/output.md.
    """
    from cosyclone.run.export import export, parse_size
    from cosyclone.run.export_shards import ExportFormat
    from cosyclone.run.folder import OutputFolderError

    try:
        summary = export(out, fmt=cast(ExportFormat, fmt), shard_size_bytes=parse_size(shard_size), to_dir=to,
                         only_passed=only_passed, log=typer.echo)
    except OutputFolderError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_WRITE) from None
    except CosycloneError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    typer.echo(summary.describe())
    raise typer.Exit(EXIT_OK)
