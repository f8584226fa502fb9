"""The run folder's format version: what a script reading a folder can rely on.

Why a number: a folder outlives the cosyclone that wrote it, and a script (or a later cosyclone) reads
folders of every age. ``summary.json`` says it (``folder_format``) and so does the index's ``meta``
table; docs/output.md lists what each version changed. A folder without it is of version 3 or earlier
(each still reads: :mod:`cosyclone.folder.record_line` takes every earlier record line).
"""

from __future__ import annotations

FOLDER_FORMAT = 3  # wavs/<shard>/ audio, appended records, the SQLite index (docs/output.md: Format versions)
