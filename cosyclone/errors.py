"""The one exception type for errors a user can cause (bad model directory, bad manifest row, ...).

Internal invariants are plain ``assert``s; anything a user can fix raises :class:`CosycloneError`
with a message that names the file/row/field and says what to do.
"""

from __future__ import annotations

from enum import IntEnum


class CosycloneError(Exception):
    """A user-facing error: the message names what was wrong and where."""


class ModelDirError(CosycloneError):
    """The model directory is incomplete, inconsistent or holds unexpected checkpoint keys."""


class ManifestError(CosycloneError):
    """A manifest row is invalid; ``line`` is 1-based, ``field`` names the offending key."""

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None,
                 row_id: str | None = None) -> None:
        where = []
        if line is not None:
            where.append(f"line {line}")
        if row_id is not None:
            where.append(f"id {row_id!r}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.line = line
        self.field = field
        self.row_id = row_id
        self.reason = message


class Exit(IntEnum):
    """The command's exit codes, defined once (the README's table; ``synth``, ``validate``, ``eval``,
    ``say`` and the API's callers read them from here)."""

    OK = 0  # every row done (valid); say: the file is written
    USAGE = 2  # unusable input: manifest or model directory unreadable, bad options, a package missing
    ROWS_FAILED = 3  # some rows failed or were rejected; the others were produced (say: the utterance failed)
    WRITE = 4  # the output folder cannot be written (rows finished before are kept)
    BUSY = 5  # another synth is writing the same folder (and shard)
    SIGINT = 130  # stopped by Ctrl-C (128 + 2), the accounts written: rerun to resume
    SIGTERM = 143  # stopped by SIGTERM (128 + 15), the accounts written: rerun to resume
