"""The one exception type for errors a user can cause (bad model directory, bad manifest row, ...).

Internal invariants are plain ``assert``s; anything a user can fix raises :class:`CosycloneError`
with a message that names the file/row/field and says what to do.
"""

from __future__ import annotations


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
