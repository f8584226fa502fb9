"""Files named by a record, read as checked files: regular, not followed where the record may not point,
and capped.

Why: a run folder is often received from someone else, and its records name files (a row's audio under
``wavs/``, the prompt recording by its absolute path) that may since have been swapped. A FIFO blocks a
plain ``read_bytes()`` forever, a link to ``/dev/zero`` grows it without end, and a link to another
row's file (or to a private file) would be read as this row's. So every such read opens the file without
blocking, refuses what is not a regular file once opened (``fstat``, so no swap can fall between the
check and the read), and reads at most ``cap`` bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path names something other than a regular file, or more bytes than its record allows."""


def read_checked(path: Path, cap: int, *, follow: bool = False) -> bytes:
    """``path``'s bytes: a regular file of at most ``cap`` bytes; ``follow=False`` refuses a symlink as
    its last component (a row's audio file is written by the run, never linked). Raises :class:`OSError`
    (:class:`NotARegularFile` for a special file, a link or an oversized file)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow and os.path.islink(path):
            raise NotARegularFile(exc.errno or 0, "a symlink, not the file the run wrote",
                                  str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(0, f"not a regular file ({_kind(st.st_mode)})", str(path))
        if st.st_size > cap:
            raise NotARegularFile(0, f"{st.st_size} bytes, more than the {cap} its record allows", str(path))
        os.set_blocking(fd, True)
        chunks, left = [], cap + 1
        while left > 0:
            block = os.read(fd, min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > cap:  # grew while read
        raise NotARegularFile(0, f"more than the {cap} bytes its record allows", str(path))
    return data


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    for test, name in kinds:
        if test(mode):
            return name
    return "a special file"


def audio_cap(samples: int | None) -> int:
    """The most bytes a row's audio file may hold: 4 bytes a sample (float WAV, the widest encoding) and
    1 MiB of headers and tags; a record without a sample count allows 2 GiB."""
    return 2**31 if samples is None else int(samples) * 4 + (1 << 20)


#: The most bytes an embedded prompt recording may hold (the frontend takes a prompt's first seconds only;
#: a longer file is not one a run was made from).
PROMPT_CAP = 256 * 2**20
