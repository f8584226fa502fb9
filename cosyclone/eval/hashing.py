"""Content hashes of the evaluation models, so every scores.jsonl line says exactly which weights scored it.

A large-v3 conversion is 3 GB: hashing it on every nightly eval would cost more than scoring a
small folder. Hashes come from the run folder's own file-hash cache
(:class:`cosyclone.folder.fingerprint.HashCache`, one cache for synth and eval), keyed by (real
path, size, mtime in ns) under ``$COSYCLONE_CACHE_DIR`` (default ``~/.cache/cosyclone``). A file
that changes in place gets a new mtime and is hashed again; an unwritable cache only costs the
re-hash.
"""

from __future__ import annotations

import threading
from pathlib import Path

from cosyclone.folder.fingerprint import HashCache

_LOCK = threading.Lock()
_CACHE: HashCache | None = None


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of the file's bytes (cached by real path, size and mtime)."""
    global _CACHE
    with _LOCK:
        if _CACHE is None:
            _CACHE = HashCache()
        digest = _CACHE.sha256(Path(path))
        _CACHE.save()
        return digest


def files_sha256(paths: list[Path]) -> dict[str, str]:
    """{file name: sha256} of the files that exist among ``paths``."""
    return {p.name: file_sha256(p) for p in paths if p.is_file()}
