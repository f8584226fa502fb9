"""Normalized texts remembered by content across runs, so a resume or a redo does not pay wetext again.

wetext's English grammar costs about 30 us per character (some 3 ms for a short row), the bulk of
validating a manifest; a resume, a second shard on the same machine or a ``--dry-run`` followed by
the run would pay it again for every unchanged text. This module keeps what
:meth:`~cosyclone.frontend.normalize.TextNormalizer.normalize` returned in one SQLite file in the
user cache directory (:func:`cosyclone.base.user_cache.cache_dir`, ``COSYCLONE_CACHE_DIR``), not in the
output folder: validation and ``--dry-run`` do not write the folder, and the same text in another
folder is the same work.

Keyed by content: sha256 of the normalizer's identity (:func:`normalizer_identity`: its kind, the
wetext and inflect versions, the source of cosyclone's normalization module and its chunking
option) and the text, never by row id or manifest line. Each entry carries a checksum of key and
value; an entry that fails it (a corrupt or hand-edited cache) is ignored and computed again, and a
file that is not a database at all is moved aside. Writes are SQLite transactions (atomic). The
cache is advisory: any error reading or writing it costs only recomputation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CACHE_NAME = "text-normalized.sqlite"
_SCHEMA = "CREATE TABLE IF NOT EXISTS norm (k TEXT PRIMARY KEY, text TEXT NOT NULL, lang TEXT NOT NULL, " \
          "sum TEXT NOT NULL) WITHOUT ROWID"
_BATCH = 500  # keys per SELECT ... IN (...): below SQLite's bound on host parameters


def normalizer_identity(normalizer: Any) -> str:
    """What the normalized text of a given input depends on, as one string: kind, package versions,
    the source of :mod:`cosyclone.frontend.normalize` and :mod:`cosyclone.frontend.text_rules` (any
    edit to the rules misses the old entries) and the sentence-chunk size."""
    from cosyclone.frontend import normalize, text_rules

    try:
        source = hashlib.sha256(
            b"".join(Path(str(m.__file__)).read_bytes() for m in (normalize, text_rules))
        ).hexdigest()
    except OSError:  # no source to read (a frozen install): the package version must do
        from cosyclone.base.version import __version__

        source = f"cosyclone-{__version__}"
    return json.dumps({**normalizer.version(), "source": source, "chunk_chars": text_rules.CHUNK_CHARS},
                      sort_keys=True)


def _key(identity: str, text: str) -> str:
    h = hashlib.sha256(identity.encode())
    h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checksum(key: str, text: str, lang: str) -> str:
    return hashlib.sha256(f"{key}\0{lang}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


class TextCache:
    """Normalized texts by content in ``path`` (an SQLite file), for one normalizer ``identity``.

    ``get_many`` returns what is stored and sound; ``put_many`` stores in one transaction. Safe
    to share between threads (one connection behind a lock) and between processes (SQLite locks).
    """

    def __init__(self, path: Path, identity: str) -> None:
        self.path, self.identity = Path(path), identity
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = self._open()
        self.hits = self.misses = self.rejected = 0  # looked up and sound / absent / failing their checksum

    def _open(self) -> sqlite3.Connection | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self._connect()
        except sqlite3.DatabaseError:  # not a database (truncated, overwritten): set it aside, start afresh
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path.with_name(f"{self.path.name}.corrupt-{os.getpid()}"))
            with contextlib.suppress(OSError, sqlite3.Error):
                return self._connect()
        except (OSError, sqlite3.Error):
            pass
        return None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            db.execute("SELECT count(*) FROM (SELECT 1 FROM norm LIMIT 1)").fetchone()
        except sqlite3.Error:
            db.close()
            raise
        return db

    @property
    def usable(self) -> bool:
        return self._db is not None

    def get_many(self, texts: Iterable[str]) -> dict[str, tuple[str, str]]:
        """{text: (normalized text, lang)} of those ``texts`` stored with a sound checksum."""
        keyed = {_key(self.identity, t): t for t in dict.fromkeys(texts) if _encodable(t)}
        out: dict[str, tuple[str, str]] = {}
        if self._db is None or not keyed:
            self.misses += len(keyed)
            return out
        keys = list(keyed)
        try:
            with self._lock:
                for i in range(0, len(keys), _BATCH):
                    part = keys[i:i + _BATCH]
                    rows = self._db.execute(
                        f"SELECT k, text, lang, sum FROM norm WHERE k IN ({','.join('?' * len(part))})", part
                    ).fetchall()
                    for k, text, lang, check in rows:
                        if (
                            isinstance(text, str)
                            and isinstance(lang, str)
                            and check == _checksum(k, text, lang)
                            and lang in ("zh", "en")
                        ):
                            out[keyed[k]] = (text, lang)
                        else:
                            self.rejected += 1
        except (sqlite3.Error, ValueError):
            return {}
        self.hits += len(out)
        self.misses += len(keyed) - len(out)
        return out

    def put_many(self, items: Iterable[tuple[str, str, str]]) -> None:
        """Store (text, normalized text, lang) triples in one transaction (replacing unsound entries)."""
        rows = []
        for text, norm, lang in items:
            if not (_encodable(text) and _encodable(norm)):  # a lone surrogate: SQLite stores UTF-8 only
                continue
            k = _key(self.identity, text)
            rows.append((k, norm, lang, _checksum(k, norm, lang)))
        if self._db is None or not rows:
            return
        with contextlib.suppress(sqlite3.Error, ValueError), self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO norm VALUES (?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")
            except sqlite3.Error:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None


_CACHES: dict[tuple[str, str], TextCache] = {}
_CACHES_LOCK = threading.Lock()


def text_cache_for(normalizer: Any) -> TextCache | None:
    """The process-wide cache of ``normalizer`` (None when disabled with ``COSYCLONE_TEXT_CACHE=0`` or
    when the file cannot be opened)."""
    if os.environ.get("COSYCLONE_TEXT_CACHE", "1") == "0":
        return None
    from cosyclone.base.user_cache import cache_dir

    path = cache_dir() / CACHE_NAME
    identity = normalizer_identity(normalizer)
    with _CACHES_LOCK:
        found = _CACHES.get((str(path), identity))
        if found is None:
            found = _CACHES[(str(path), identity)] = TextCache(path, identity)
        return found if found.usable else None
