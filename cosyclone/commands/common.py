"""What the doors' commands share: a usage error's exit, and the exit code of each way a run can stop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

from cosyclone.errors import CosycloneError, Exit


def fail(msg: str) -> NoReturn:
    """A usage error: one line on stderr and exit 2."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(Exit.USAGE)


@contextmanager
def folder_errors() -> Iterator[None]:
    """The exit code of each way a run can stop before it finishes: 5 busy, 4 unwritable, 2 unusable input."""
    from cosyclone.folder.layout import OutputFolderError
    from cosyclone.folder.lock import FolderBusy

    try:
        yield
    except FolderBusy as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(Exit.BUSY) from None
    except OutputFolderError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(Exit.WRITE) from None
    except CosycloneError as exc:  # the model did not load; a Ray run that lost rows
        fail(str(exc))
