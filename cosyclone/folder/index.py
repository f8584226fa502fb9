"""The folder's index: where each row's current record lies, what it says in brief, and the totals.

Why an index: a folder grows for weeks to millions of rows, and a run, ``report`` and ``eval`` should
cost what their own rows cost, not a re-read of every record. The record files stay the truth (JSON
lines a person reads, appended to, never rewritten); ``.cosyclone/index.sqlite`` (stdlib SQLite) is
derived from them: per row its id, fingerprint, status, audio file, manifest line, ``finished_at``,
the record file and byte offset of its current record, and its share of the totals, which a
``totals`` table keeps summed as rows are written (``summary.json`` and ``report`` read a few numbers).

The index follows the files, never the other way round: a record line is written (and fsynced)
before the index hears of it. Opening the index checks each records file against what was indexed
of it (inode, size, modification time, a hash of its first line and of the bytes before where the index
stopped): a file that grew with those bytes unchanged is read from where the index stopped (a run killed
between the two writes, another shard's journal); a file that shrank, was replaced or was changed in
place (even at the same size: its modification time moved while its size did not), or an index that is
missing, unreadable or of another schema, makes the index be built again from every records file,
streaming. A whole line that is not a record (:func:`~cosyclone.folder.record_line.parse_record`) is
kept in a ``corrupt`` table by file and byte offset, so ``report`` names it. The current record of an id
is the one with the latest ``finished_at``, a later line winning a tie (every reader of a row's current
record goes through this index: :mod:`cosyclone.folder.current`). Totals
are exact in any order rows arrive in (a resume, shards, a row redone): counts are integers, and
audio seconds are summed as integers of 2^-40 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from cosyclone.folder.index_reads import IndexReads
from cosyclone.folder.index_rows import COLUMNS, SHARE_COLUMNS, add_share, row_values, share_ddl
from cosyclone.folder.record_line import parse_record, why_not_a_record
from cosyclone.folder.version import FOLDER_FORMAT

INDEX_NAME = "index.sqlite"  # under the folder's .cosyclone/
SCHEMA = "cosyclone-index-3"  # 3: sources keep mtime and tail, corrupt lines kept
ROWS_PER_COMMIT = 2000  # record lines read into the index per transaction (what a build holds at once)


def _head(path: Path) -> str:
    """A hash of a file's first line: tells a rewritten file from one that only grew."""
    with open(path, "rb") as fh:
        return hashlib.blake2b(fh.readline(), digest_size=8).hexdigest()


TAIL_BYTES = 4096  # the bytes before the indexed end whose hash tells a file that only grew


def _tail(path: Path, end: int) -> str:
    """A hash of the ``TAIL_BYTES`` before byte ``end`` (what an append leaves as it was)."""
    with open(path, "rb") as fh:
        fh.seek(max(0, end - TAIL_BYTES))
        return hashlib.blake2b(fh.read(min(end, TAIL_BYTES)), digest_size=8).hexdigest()


class FolderIndex(IndexReads):
    """The index of one run folder, opened up to date with its records files (see the module).

    ``sources`` are the records files, relative to the folder, that the folder holds now (the caller
    lists them: ``diagnostics.jsonl`` and the journals). One object may be shared by a run's threads.
    """

    def __init__(self, out_dir: Path, sources: Sequence[str], *, state: str = ".cosyclone") -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / state / INDEX_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self.rebuilt = False  # whether opening built the index from the records files
        self._files: dict[str, BinaryIO] = {}  # record files read by record(), kept open
        self.db = self._connect()
        self.sync(sources)

    # ------------------------------------------------------------------ opening

    def _connect(self) -> sqlite3.Connection:
        """The index file opened (a file that is not a database is removed: it is built again)."""
        try:
            return self._open()
        except sqlite3.DatabaseError:
            self._discard()
            return self._open()

    def _discard(self) -> None:
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=600.0, check_same_thread=False, isolation_level=None)
        # small pages: a few rows' index stays a few kB (takes on creation)
        db.execute("PRAGMA page_size=1024")
        # a rollback journal, not WAL: no 32 kB shared-memory file beside it, so the index needs no more
        # room than its rows (a nearly full disk fails on the audio, as before); readers read a page of
        # rows per query, so a writer never waits long
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("PRAGMA synchronous=NORMAL")  # a lost or torn commit is built again from the records files
        return db

    def _schema_ok(self) -> bool:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.DatabaseError:
            return False
        return row is not None and row[0] == SCHEMA

    def _create(self) -> None:
        """A fresh, empty index (any earlier one is dropped)."""
        db = self.db
        with self._tx():
            for table in ("meta", "sources", "rows", "totals", "corrupt"):
                db.execute(f"DROP TABLE IF EXISTS {table}")
            db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE sources (name TEXT PRIMARY KEY, inode INTEGER, size INTEGER, head TEXT, "
                       "mtime INTEGER, tail TEXT)")
            db.execute("CREATE TABLE corrupt (src TEXT NOT NULL, offset INTEGER NOT NULL, why TEXT NOT NULL, "
                       "PRIMARY KEY (src, offset)) WITHOUT ROWID")
            shares = ", ".join(share_ddl())  # every share column but ``reason``, declared below
            db.execute(
                "CREATE TABLE rows (id TEXT PRIMARY KEY, fingerprint TEXT, status TEXT NOT NULL, file TEXT, "
                "meta_dir TEXT, samples INTEGER, sample_rate INTEGER, line INTEGER NOT NULL, "
                f"finished_at REAL NOT NULL, src TEXT NOT NULL, offset INTEGER NOT NULL, reason TEXT, "
                f"{shares}) WITHOUT ROWID"
            )
            db.execute("CREATE TABLE totals (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute("INSERT INTO meta VALUES ('schema', 'building')")  # SCHEMA once the build is whole
            db.execute("INSERT INTO meta VALUES ('folder_format', ?)", (str(FOLDER_FORMAT),))

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def sync(self, sources: Sequence[str]) -> None:
        """Bring the index up to the records files ``sources``: read what grew, rebuild on anything else."""
        with self._lock:
            try:
                if not self._schema_ok():
                    raise _Stale
                known = {row[0]: row[1:] for row
                         in self.db.execute("SELECT name, inode, size, head, mtime, tail FROM sources")}
                if set(known) - set(sources):  # a file the index points into is gone
                    raise _Stale
                tails: list[tuple[str, int]] = []
                for name in sources:
                    was = known.get(name)
                    if was is None:
                        tails.append((name, 0))
                    elif _changed(self.out_dir / name, *was):
                        raise _Stale
                    elif os.stat(self.out_dir / name).st_size > was[1]:
                        tails.append((name, was[1]))
                for name, start in tails:
                    self._read_source(name, start)
            except (_Stale, sqlite3.DatabaseError):
                self.rebuild(sources)

    def rebuild(self, sources: Sequence[str]) -> None:
        """The index made again from the records files, streaming (a line at a time, rows in SQLite)."""
        with self._lock:
            try:
                self._create()
            except sqlite3.DatabaseError:  # not a database at all: start a new file
                self.db.close()
                self._discard()
                self.db = self._open()
                self._create()
            # one transaction, unsynced, its journal in memory, the secondary indexes made at the end: a
            # kill or a crash meanwhile leaves the schema 'building', and the next open builds again
            for pragma in ("synchronous=OFF", "journal_mode=MEMORY", "cache_size=-65536"):
                self.db.execute(f"PRAGMA {pragma}")
            try:
                with self._tx():
                    for name in sources:
                        self._read_source(name, 0, bulk=True)
                    for sql in _SECONDARY:
                        self.db.execute(sql)
                    self._recount()
            finally:
                for pragma in ("journal_mode=DELETE", "synchronous=NORMAL", "cache_size=-2000"):
                    self.db.execute(f"PRAGMA {pragma}")
            with self._tx():  # a synced commit: the whole build is on disk before it is taken as the index
                self.db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA,))
            self.rebuilt = True

    def _read_source(self, name: str, start: int, *, bulk: bool = False) -> None:
        """Index the lines of records file ``name`` from byte ``start`` on (whole lines only); ``bulk``:
        into an empty index, in the caller's transaction (totals are counted after)."""
        path = self.out_dir / name
        st = os.stat(path)
        batch: list[tuple[Any, ...]] = []
        bad: list[tuple[str, int, str]] = []
        end = start
        with open(path, "rb") as fh:
            fh.seek(start)
            pos = start
            for raw in fh:
                here, pos = pos, pos + len(raw)
                if not raw.endswith(b"\n"):
                    break  # a line still being written (or torn): read again next time
                end = pos
                rec = parse_record(raw)
                if rec is not None:
                    batch.append(row_values(rec, name, here))
                elif raw.strip():
                    bad.append((name, here, why_not_a_record(raw)))
                if len(batch) >= ROWS_PER_COMMIT:
                    self._put_batch(batch, bulk=bulk)
                    batch = []
        self._put_batch(batch, bulk=bulk)
        with contextlib.nullcontext() if bulk else self._tx():
            self.db.executemany("INSERT OR REPLACE INTO corrupt VALUES (?, ?, ?)", bad)
            self.db.execute("INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?)",
                            (name, st.st_ino, end, _head(path) if end else "", os.stat(path).st_mtime_ns,
                             _tail(path, end)))

    def _put_batch(self, batch: list[tuple[Any, ...]], *, bulk: bool) -> None:
        if not batch:
            return
        if bulk:
            self.db.executemany(_UPSERT, batch)
            return
        with self._tx():
            for values in batch:
                self._put(values)

    # ------------------------------------------------------------------ writing

    def put(self, obj: Mapping[str, Any], src: str, offset: int, end: int) -> str | None:
        """A record line just written at ``offset`` of records file ``src`` (which now ends at ``end``);
        the metadata directory of the row's earlier file (None: it had none)."""
        return self.put_many([obj], src, [offset], end)[0]

    def put_many(self, objs: Sequence[Mapping[str, Any]], src: str, offsets: Sequence[int],
                 end: int) -> list[str | None]:
        """:meth:`put` for lines written together (one transaction: a writer's group costs one commit)."""
        was: list[str | None] = []
        with self._tx():
            for obj, offset in zip(objs, offsets, strict=True):
                rec = parse_record(obj)
                was.append(self._put(row_values(rec, src, offset)) if rec is not None else None)
            path = self.out_dir / src
            self.db.execute("UPDATE sources SET size = ?, mtime = ?, tail = ? WHERE name = ? AND size < ?",
                            (end, os.stat(path).st_mtime_ns, _tail(path, end), src, end))
            if offsets and min(offsets) == 0:  # the file's first line: what tells it from a rewritten one
                self.db.execute(
                    "UPDATE sources SET head = ? WHERE name = ?", (_head(self.out_dir / src), src)
                )
        return was

    def track(self, src: str) -> None:
        """Start following a records file this process writes (a journal it opens)."""
        path = self.out_dir / src
        st = os.stat(path)
        with self._lock:
            known = self.db.execute("SELECT size FROM sources WHERE name = ?", (src,)).fetchone()
            if known is None or known[0] < st.st_size:
                self._read_source(src, known[0] if known else 0)

    def _put(self, values: tuple[Any, ...]) -> str | None:
        """One row's record in, the totals moved by the difference of its share (in a transaction); the
        metadata directory of the row's earlier current record."""
        rid, finished = values[0], values[8]
        old = self.db.execute(
            f"SELECT finished_at, meta_dir, {', '.join(SHARE_COLUMNS)} FROM rows WHERE id = ?", (rid,)
        ).fetchone()
        if old is not None and finished < old[0]:
            return None  # an older attempt read late: the current record stays
        self.db.execute(f"INSERT OR REPLACE INTO rows ({', '.join(COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(COLUMNS))})", values)
        delta: dict[str, int] = {}
        add_share(delta, values[len(COLUMNS) - len(SHARE_COLUMNS):], +1)
        if old is not None:
            add_share(delta, old[2:], -1)
        self._add(delta)
        return old[1] if old is not None else None

    def _add(self, delta: Mapping[str, int]) -> None:
        for key, v in delta.items():
            if not v:
                continue
            row = self.db.execute("SELECT value FROM totals WHERE key = ?", (key,)).fetchone()
            value = (int(row[0]) if row else 0) + v  # Python ints: the audio sum outgrows 64 bits
            self.db.execute("INSERT OR REPLACE INTO totals VALUES (?, ?)", (key, str(value)))

    def _recount(self) -> None:
        """The totals summed again over the rows table (after a rebuild), streaming."""
        self.db.execute("DELETE FROM totals")
        delta: dict[str, int] = {}
        for share in self.db.execute(f"SELECT {', '.join(SHARE_COLUMNS)} FROM rows"):
            add_share(delta, share, +1)
        self._add(delta)

    def moved(self, src: str, dst: str, lines: Iterable[tuple[str, int, int]], dst_end: int) -> None:
        """Records of ``src`` now lie in ``dst`` too: (id, offset in src, offset in dst) of each; ``src``
        is no longer followed and ``dst`` is indexed up to ``dst_end``."""
        with self._tx():
            self.db.executemany("UPDATE rows SET src = ?, offset = ? WHERE id = ? AND src = ? AND offset = ?",
                                ((dst, new, rid, src, old) for rid, old, new in lines))
            self._followed(src, dst, dst_end)

    def whole_records(self, src: str) -> bool:
        """Whether every line of records file ``src`` is a record the index read (none torn, none
        corrupt, none past where it stopped): then the file may move as bytes (:meth:`moved_whole`)."""
        with self._lock:
            known = self.db.execute("SELECT size FROM sources WHERE name = ?", (src,)).fetchone()
            bad = self.db.execute("SELECT 1 FROM corrupt WHERE src = ? LIMIT 1", (src,)).fetchone()
        return known is not None and bad is None and known[0] == os.stat(self.out_dir / src).st_size

    def dirs_in(self, src: str) -> set[str]:
        """The metadata directories of the ``ok`` rows whose current record lies in ``src``."""
        with self._lock:
            return {r[0] for r in self.db.execute(
                "SELECT DISTINCT meta_dir FROM rows WHERE src = ? AND meta_dir IS NOT NULL", (src,))}

    def moved_whole(self, src: str, dst: str, base: int, dst_end: int) -> None:
        """All of ``src`` now lies in ``dst`` from byte ``base`` on, as it was: :meth:`moved` in one
        statement (each row's offset shifted by ``base``), no line read again."""
        with self._tx():
            self.db.execute("UPDATE rows SET src = ?, offset = offset + ? WHERE src = ?", (dst, base, src))
            self._followed(src, dst, dst_end)

    def _followed(self, src: str, dst: str, dst_end: int) -> None:
        """``src`` no longer followed, ``dst`` indexed up to ``dst_end`` (in a transaction)."""
        self.db.execute("DELETE FROM sources WHERE name = ?", (src,))
        self.db.execute("DELETE FROM corrupt WHERE src = ?", (src,))
        path = self.out_dir / dst
        st = os.stat(path)
        self.db.execute("INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?, ?, ?)",
                        (dst, st.st_ino, dst_end, _head(path), st.st_mtime_ns, _tail(path, dst_end)))

    # ------------------------------------------------------------------ reading

    def close(self) -> None:
        with self._lock:
            self.db.close()
            while self._files:
                self._files.popitem()[1].close()


def _changed(path: Path, inode: int, size: int, head: str, mtime: int | None, tail: str | None) -> bool:
    """Whether a records file is no longer what the index read of it (anything but an append)."""
    st = os.stat(path)
    if st.st_ino != inode or st.st_size < size or mtime is None:
        return True
    if st.st_size == size and st.st_mtime_ns != mtime:
        return True  # written in place at the same size
    return bool(size) and (_head(path) != head or _tail(path, size) != tail)


class _Stale(Exception):
    """The index does not describe the records files: it is built again."""


_SECONDARY = ("CREATE INDEX rows_meta ON rows (meta_dir) WHERE meta_dir IS NOT NULL",
              "CREATE INDEX rows_ok ON rows (line, id) WHERE status = 'ok'")
_UPSERT = (f"INSERT INTO rows ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
           "ON CONFLICT(id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
           + " WHERE excluded.finished_at >= rows.finished_at")
