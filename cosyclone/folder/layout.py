"""The output folder as a dataset: row fingerprints, the record files, the index, the writer lock.

A run folder holds:

* ``diagnostics.jsonl``: the row records, appended run by run (a row redone has a later line;
  the current record of a row is its latest ``finished_at``); never rewritten;
* ``.cosyclone/journal-<shard>.jsonl``: appends of the run in progress (fsynced per row), appended
  to ``diagnostics.jsonl`` and removed when the run ends (:mod:`.settle`);
* ``.cosyclone/index.sqlite``: where each row's current record lies and the folder totals
  (:mod:`.index`), derived from the record files and built again from them when missing or stale;
* ``.cosyclone/lock-<shard>.json``: the running writer (pid, host, start time, command);
* ``wavs/<shard>/<id>.wav``: the audio, in 4096 directories named by a hash of the id (ten million
  rows give about 2,500 files a directory); a flat ``wavs/<id>.wav`` of an earlier version is read;
* ``metadata.jsonl`` in each of those directories (and at the root for flat files): one line per
  ``ok`` row for ``datasets.load_dataset("audiofolder")``, ``file_name`` relative to it;
* ``summary.json`` (folder totals and the last invocation), ``runs.jsonl`` (invocation history),
  ``errors.jsonl`` (tracebacks of non-user errors).

A row is *done* when its record says ``ok``, its audio file holds the recorded number of samples and
its fingerprint equals the fingerprint the current inputs give (:func:`row_fingerprint`). Anything
else is redone, and what changed is counted by fingerprint part (``text``, ``seed``, ...).

Why records win by ``finished_at`` rather than by file position: shards write separate journals, so
"last line" has no meaning across files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cosyclone.base.atomic import tmp_name, write_atomic
from cosyclone.errors import CosycloneError
from cosyclone.folder.audio_out import SUFFIXES
from cosyclone.folder.index import FolderIndex

DIAG_NAME = "diagnostics.jsonl"
METADATA_NAME = "metadata.jsonl"
RUNS_NAME = "runs.jsonl"
ERRORS_NAME = "errors.jsonl"
STATE_DIR = ".cosyclone"  # journals and locks: the folder's working state
WAV_DIR = "wavs"
TOKEN_DIR = "tokens"  # under STATE_DIR: the stage-0 checkpoint (token_store.py)


class OutputFolderError(CosycloneError):
    """The output folder cannot be used: not writable, or a write failed (disk full, permission)."""


# ----------------------------------------------------------------------------- records

def state_dir(out_dir: Path) -> Path:
    return Path(out_dir) / STATE_DIR


def shard_tag(shard: str | None) -> str:
    """``all`` or ``shard-I-of-N``: names this writer's journal and lock."""
    if not shard:
        return "all"
    i, n = shard.split("/")
    return f"shard-{int(i)}-of-{int(n)}"


def journal_path(out_dir: Path, tag: str) -> Path:
    return state_dir(out_dir) / f"journal-{tag}.jsonl"


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Objects of a JSONL file; a line that does not parse (torn by a kill) is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    # lines end at "\n" only: str.splitlines would also cut at U+2028/U+2029, which a text may hold raw
    for raw in data.decode("utf-8", errors="replace").split("\n"):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def shard_of(row_id: str) -> str:
    """The ``wavs/`` subdirectory of a row's audio: 3 hex digits of a hash of its id (4096 of them)."""
    return hashlib.blake2b(row_id.encode("utf-8", "surrogatepass"), digest_size=2).hexdigest()[:3]


def wav_path(out_dir: Path, row_id: str, suffix: str = ".wav") -> Path:
    """Where a row's audio file is written: ``wavs/<shard>/<id>.wav`` (or another ``suffix``)."""
    return Path(out_dir) / WAV_DIR / shard_of(row_id) / f"{row_id}{suffix}"


def flat_path(out_dir: Path, row_id: str, suffix: str = ".wav") -> Path:
    """Where an earlier version wrote a row's audio: ``wavs/<id>.wav`` (read, never written)."""
    return Path(out_dir) / WAV_DIR / f"{row_id}{suffix}"


class HasFile(Protocol):
    """What locating a row's audio needs of its record (a :class:`RowRecord` or an indexed row)."""

    @property
    def id(self) -> str: ...

    @property
    def file(self) -> str | None: ...

    @property
    def samples(self) -> int | None: ...

    @property
    def ok(self) -> bool: ...


def audio_path(out_dir: Path, record: HasFile) -> Path | None:
    """The audio file a record vouches for (None: a failed row has none). The record's ``file`` is
    taken only when it is one of the two places a row's file may lie (``wavs/<shard>/<id>`` or an
    earlier version's ``wavs/<id>``, with a known suffix), so a record cannot point a resume or an
    export outside ``wavs/``; anything else reads as the flat place."""
    if not record.file:
        return None
    suffix = Path(record.file).suffix.lower()
    suffix = suffix if suffix in SUFFIXES.values() else SUFFIXES["wav"]
    sharded = wav_path(out_dir, record.id, suffix)
    if Path(record.file).as_posix() == sharded.relative_to(out_dir).as_posix():
        return sharded
    return flat_path(out_dir, record.id, suffix)


def wav_frames(path: Path) -> int | None:
    """Frames in a WAV's header, None when it is missing or unreadable."""
    if not os.path.isfile(path):  # a stat: a plan of a million rows asks for many files that are not there
        return None
    try:
        import soundfile as sf

        return int(sf.info(str(path)).frames)
    except Exception:  # missing, torn or not a WAV: the row is not done
        return None


def is_complete(out_dir: Path, record: HasFile) -> bool:
    """An ``ok`` record whose audio file exists with the recorded number of samples."""
    path = audio_path(out_dir, record)
    if not record.ok or path is None:
        return False
    frames = wav_frames(path)
    if frames is None:
        return False
    return record.samples is None or int(record.samples) == frames


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists on this host (its temporaries and lock are its own)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----------------------------------------------------------------------------- durability

def write_bytes_atomic(path: Path, data: bytes, *, tmp_dir: Path | None = None,
                       tmp: Path | None = None) -> None:
    """``data`` written over ``path`` atomically (:func:`cosyclone.base.atomic.write_atomic`), its
    temporary beside ``path``, or in ``tmp_dir`` (on the same filesystem: the ``wavs/`` shards keep theirs
    in ``wavs/`` itself, so that a killed run's leftovers are found without listing every shard).
    ``tmp``: the name the temporary is made from instead (``path``'s, in ``tmp_dir`` or beside it).

    On any error :class:`OutputFolderError` names the file and the system's reason (``No space left on
    device``, ``File too large``, ...): nothing torn is left.
    """
    try:
        base = tmp if tmp is not None else tmp_dir / path.name if tmp_dir is not None else path
        write_atomic(path, data, tmp=tmp_name(base))
    except OSError as exc:
        raise OutputFolderError(f"cannot write {path}: {exc.strerror or exc}") from exc


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Remove temporary files left by dead processes of this host (a killed run); returns them."""
    host = socket.gethostname()
    removed = []
    for folder in (
        Path(out_dir),
        Path(out_dir) / WAV_DIR,
        state_dir(out_dir),
        state_dir(out_dir) / TOKEN_DIR,
    ):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*.tmp"):
            bits = path.name[:-4].rsplit(".", 2)
            if len(bits) != 3 or bits[1] != host or not bits[2].isdigit() or pid_alive(int(bits[2])):
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


def check_writable(out_dir: Path) -> None:
    """Refuse an output folder that cannot be written, before any model loads."""
    out_dir = Path(out_dir)
    try:
        for d in (out_dir, out_dir / WAV_DIR, state_dir(out_dir)):
            d.mkdir(parents=True, exist_ok=True)
        probe = tmp_name(state_dir(out_dir) / "probe")
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise OutputFolderError(f"output folder {out_dir} is not writable: {exc.strerror or exc}") from exc


def writable(path: Path) -> bool:
    """Whether this process may write into folder ``path``: its permissions (``access``) and its mount (a
    read-only mount, where root's ``access`` still says yes)."""
    try:
        return os.access(path, os.W_OK | os.X_OK) and not os.statvfs(path).f_flag & os.ST_RDONLY
    except OSError:
        return False


def check_creatable(out_dir: Path) -> None:
    """Refuse an output folder that could not be written, creating nothing (``--dry-run``).

    The nearest folder that exists on the way to ``out_dir`` (``out_dir`` itself, when it exists)
    must be a folder this process may write into.
    """
    out_dir = Path(out_dir).absolute()
    here = out_dir
    while not here.exists() and here.parent != here:
        here = here.parent
    if not here.is_dir():
        raise OutputFolderError(f"output folder {out_dir} cannot be made: {here} is not a folder")
    if not os.access(here, os.W_OK | os.X_OK):
        raise OutputFolderError(f"output folder {out_dir} is not writable: {here} does not let this user "
                                "write")


# ----------------------------------------------------------------------------- journal

class Journal:
    """This writer's append-only record log: each line whole, flushed and fsynced before returning."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.end = os.fstat(self._fd).st_size  # where the next line starts (one writer per journal)
        if self.end and os.pread(self._fd, 1, self.end - 1) != b"\n":
            # a killed run cut its last line: start on a fresh one (the torn line never parses)
            self._write(b"\n")

    def _write(self, data: bytes) -> int:
        """``data`` appended and fsynced; the offset it starts at."""
        start = self.end
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as exc:
            raise OutputFolderError(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        self.end = start + len(data)
        return start

    def append(self, obj: Mapping[str, Any]) -> int:
        """One object as one line; the byte offset the line starts at."""
        return self.append_line(
            json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str).encode() + b"\n"
        )

    def append_line(self, line: bytes) -> int:
        """A whole line (ending in ``\\n``) as it is; the byte offset it starts at."""
        return self._write(line)

    def append_all(self, lines: Sequence[bytes]) -> list[int]:
        """Whole lines (each :func:`encode_line`'s), written and fsynced together (a writer's group: one
        flush, not one per line); the byte offset each line starts at."""
        start = self._write(b"".join(lines))
        offsets = []
        for line in lines:
            offsets.append(start)
            start += len(line)
        return offsets

    def close(self) -> None:
        os.close(self._fd)


def encode_line(obj: Mapping[str, Any]) -> bytes:
    """One object as the journal's line (what :meth:`Journal.append` writes)."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str).encode() + b"\n"


def append_jsonl(path: Path, obj: Mapping[str, Any]) -> None:
    """One whole line appended to a shared log (runs, errors), fsynced."""
    j = Journal(path)
    try:
        j.append(obj)
    finally:
        j.close()


@contextlib.contextmanager
def settle_lock(out_dir: Path) -> Iterator[None]:
    """Serializes the end of runs (a journal appended to ``diagnostics.jsonl``, metadata) between the
    shard writers of one folder (same host or a POSIX-locking share)."""
    path = state_dir(out_dir) / "compact.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def record_sources(out_dir: Path) -> list[str]:
    """The folder's record files that exist, relative to it: ``diagnostics.jsonl``, then the journals."""
    out_dir = Path(out_dir)
    found = [DIAG_NAME] if (out_dir / DIAG_NAME).is_file() else []
    return found + [f"{STATE_DIR}/{p.name}" for p in sorted(state_dir(out_dir).glob("journal-*.jsonl"))]


def open_index(out_dir: Path) -> FolderIndex:
    """The folder's index, up to date with its record files (built from them, streaming, when missing
    or stale). Raises :class:`OutputFolderError` when the folder cannot hold it."""
    try:
        return FolderIndex(Path(out_dir), record_sources(out_dir), state=STATE_DIR)
    except (OSError, sqlite3.Error) as exc:
        raise OutputFolderError(f"cannot index the records of {out_dir}: {exc}") from exc

