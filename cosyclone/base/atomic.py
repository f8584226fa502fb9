"""The one atomic write: a temporary file beside the target, fsynced, renamed over it, the directory
fsynced; a reader sees the old file or the new one, never half of one, and a kill leaves no torn target.

Why in the base: the run folder's files, the stage-0 checkpoint (:mod:`cosyclone.base.handoff`), eval's
and report's outputs and the user cache are all written this way, from every layer. The temporary's name
says its host and process (:func:`tmp_name`), so a later run can tell a dead process's leftover from a
live one's (:func:`cosyclone.folder.layout.remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable
from pathlib import Path


def tmp_name(path: Path) -> Path:
    """A temporary sibling of ``path`` naming this host and process (so a later run can clean it)."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in the folder ``path`` durable (or a file's written bytes: any path opens)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | bytearray | memoryview | Iterable[bytes], *,
                 tmp: Path | None = None, sync_dir: bool = True, durable: bool = True,
                 exclusive: bool = False) -> None:
    """``data`` (bytes, or chunks written as they come, so a large file is never held whole) to ``tmp``
    (default :func:`tmp_name` of ``path``; on the same filesystem), fsync, rename over ``path``, fsync
    the directory unless ``sync_dir`` is False (a checkpoint that a lost rename only costs a rerun).
    ``durable`` False: no fsync at all (a file whose checksum catches a torn write after a crash; the
    rename still keeps a reader from seeing half of it).
    ``exclusive``: the temporary must not exist (a link planted at its name is never written through).

    On any error the temporary is removed and the error raised as it came (an ``OSError`` names the
    system's reason: ``No space left on device``, ``File too large``, ...).
    """
    tmp = tmp if tmp is not None else tmp_name(path)
    once = os.O_EXCL | getattr(os, "O_CLOEXEC", 0) if exclusive else os.O_TRUNC
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | once, 0o644)  # a temporary not made here is never removed
    try:
        try:
            for chunk in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                view = memoryview(chunk)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync_dir and durable:
        fsync_dir(path.parent)
