"""Content hashes of the evaluation models, so every eval.jsonl line says exactly which weights scored it.

A large-v3 conversion is 3 GB: hashing it on every nightly eval would cost more than scoring a
small folder. Hashes are therefore cached per file, keyed by (absolute path, size, mtime in ns),
in ``$COSYCLONE_CACHE_DIR/file_sha256.json`` (default ``~/.cache/cosyclone``). A file that changes
in place gets a new mtime and is hashed again; an unwritable cache only costs the re-hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

_LOCK = threading.Lock()
_MEMO: dict[tuple[str, int, int], str] = {}


def _cache_file() -> Path:
    root = os.environ.get("COSYCLONE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "cosyclone")
    return Path(root) / "file_sha256.json"


def _read_cache(path: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of the file's bytes (cached by path, size and mtime)."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
        cache_path = _cache_file()
        cache = _read_cache(cache_path)
        hit = cache.get(str(p))
        if isinstance(hit, dict) and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns:
            digest = str(hit.get("sha256"))
        else:
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            digest = h.hexdigest()
            cache[str(p)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
            try:
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}")
                tmp.write_text(json.dumps(cache, indent=0, sort_keys=True), encoding="utf-8")
                os.replace(tmp, cache_path)
            except OSError:
                pass  # a read-only home: the hash is still right, only not remembered
        _MEMO[key] = digest
        return digest


def files_sha256(paths: list[Path]) -> dict[str, str]:
    """{file name: sha256} of the files that exist among ``paths``."""
    return {p.name: file_sha256(p) for p in paths if p.is_file()}
