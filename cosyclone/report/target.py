"""Where ``report --html PAGE`` may write: a page of its own, never over a file it did not write.

Why: ``--html`` takes any path, and a slip (``--html OUT/diagnostics.jsonl``, ``runs.jsonl``, a WAV)
would replace a run folder's records, which nothing can rebuild. So the page and its redo manifest are
checked before a folder is read: the page lies outside every run folder given, its parent folder exists
(none is made), and a file already there is replaced only when it is a page ``report`` wrote (its
``generator`` tag); the redo manifest beside it only when that page is (it was written with it). Both
are written to a temporary file created beside them and renamed over; a failure removes it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cosyclone.base.atomic import write_atomic
from cosyclone.errors import CosycloneError

GENERATOR = '<meta name="generator" content="cosyclone report">'  # in every page's head: "a page of ours"
_HEAD_BYTES = 1024  # where the tag lies (the page's first lines)


def _is_our_page(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            return GENERATOR.encode() in fh.read(_HEAD_BYTES)
    except OSError:
        return False


def check_page(page: Path, folders: Sequence[Path]) -> None:
    """Refuse a page path that would write over what the report does not own (see the module)."""
    text = os.fspath(page)
    if not text.strip():
        raise CosycloneError("--html needs a file name for the page (such as report.html)")
    if text.endswith(os.sep) or page.is_dir() or not page.name:
        raise CosycloneError(f"--html {page} is a folder: give the page's file name (such as report.html)")
    parent = page.parent if str(page.parent) else Path(".")
    if not parent.is_dir():
        raise CosycloneError(f"--html {page}: its folder {parent} does not exist (report makes no folders)")
    where = parent.resolve() / page.name
    for folder in folders:
        root = Path(folder).resolve()
        if where == root or root in where.parents:
            raise CosycloneError(f"--html {page} lies inside the run folder {folder}: the page never goes "
                                 "among a run's files; write it elsewhere")
    if os.path.lexists(page) and not _is_our_page(page):
        raise CosycloneError(f"--html {page} exists and is not a page cosyclone report wrote: it is left as "
                             "it is; give a new file name")


def check_redo(page: Path, redo: Path) -> None:
    """Refuse a redo manifest path holding a file not written with the page there (see the module)."""
    if os.path.lexists(redo) and not (_is_our_page(page) and redo.is_file() and not redo.is_symlink()):
        raise CosycloneError(f"{redo} exists and was not written with a page of cosyclone report: it is "
                             "left as it is; give another page name")


def write_new(path: Path, data: bytes) -> None:
    """``data`` over ``path`` by :func:`~cosyclone.base.atomic.write_atomic`, its temporary created beside
    ``path`` and never an existing file (``exclusive``: a link planted there is not written through); the
    temporary is removed on any failure."""
    write_atomic(path, data, exclusive=True)
