"""The output folder as a dataset: row fingerprints, the journal, one record per row, the writer lock.

A run folder holds, besides ``wavs/``:

* ``diagnostics.jsonl``: exactly one record per row (its latest attempt) once no run is active;
* ``.cosyclone/journal-<shard>.jsonl``: appends of the run in progress (fsynced per row), merged
  into ``diagnostics.jsonl`` and removed when the run ends (:func:`compact`);
* ``.cosyclone/lock-<shard>.json``: the running writer (pid, host, start time, command);
* ``metadata.jsonl``: one line per ``ok`` row for ``datasets.load_dataset("audiofolder")``;
* ``summary.json`` (folder totals and the last invocation), ``runs.jsonl`` (invocation history),
  ``errors.jsonl`` (tracebacks of non-user errors).

A row is *done* when its record says ``ok``, its WAV holds the recorded number of samples and its
fingerprint equals the fingerprint the current inputs give (:func:`row_fingerprint`). Anything
else is redone, and what changed is counted by fingerprint part (``text``, ``seed``, ...).

Why records win by ``finished_at`` rather than by file position: shards write separate journals and
a folder may be compacted by any of them, so "last line" has no meaning across files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosyclone.errors import CosycloneError
from cosyclone.run.audio_out import SUFFIXES
from cosyclone.run.columns import metadata_line
from cosyclone.run.fingerprint import changed_parts, same_inputs
from cosyclone.run.row_record import RowRecord

if TYPE_CHECKING:  # annotations only: reading a folder's records loads neither torch nor the frontend
    from cosyclone.manifest import ManifestRow

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


def read_records(out_dir: Path) -> dict[str, RowRecord]:
    """The current record per row id: ``diagnostics.jsonl`` and every journal, latest ``finished_at`` wins."""
    out_dir = Path(out_dir)
    sources = [out_dir / DIAG_NAME, *sorted(state_dir(out_dir).glob("journal-*.jsonl"))]
    found: dict[str, RowRecord] = {}
    for path in sources:
        for obj in iter_jsonl(path):
            try:
                rec = RowRecord.from_json(obj)
            except (TypeError, ValueError):  # a line no version of cosyclone wrote: not a record
                continue
            if rec is None:
                continue
            prev = found.get(rec.id)
            if prev is None or rec.finished_at >= prev.finished_at:
                found[rec.id] = rec
    return found


def wav_path(out_dir: Path, row_id: str, suffix: str = ".wav") -> Path:
    """Where a row's audio file lies in a run folder (``wavs/<id>.wav``, or another ``suffix``)."""
    return Path(out_dir) / WAV_DIR / f"{row_id}{suffix}"


def audio_path(out_dir: Path, record: RowRecord) -> Path | None:
    """The audio file a record vouches for: ``wavs/<id><suffix>``, the suffix read from its ``file``
    (None: a failed row has none). Only the suffix comes from the record, so a record cannot point a
    resume or an export outside ``wavs/``."""
    if not record.file:
        return None
    suffix = Path(record.file).suffix.lower()
    return wav_path(out_dir, record.id, suffix if suffix in SUFFIXES.values() else SUFFIXES["wav"])


def wav_frames(path: Path) -> int | None:
    """Frames in a WAV's header, None when it is missing or unreadable."""
    try:
        import soundfile as sf

        return int(sf.info(str(path)).frames)
    except Exception:  # missing, torn or not a WAV: the row is not done
        return None


def is_complete(out_dir: Path, record: RowRecord) -> bool:
    """An ``ok`` record whose audio file exists with the recorded number of samples."""
    path = audio_path(out_dir, record)
    if not record.ok or path is None:
        return False
    frames = wav_frames(path)
    if frames is None:
        return False
    return record.samples is None or int(record.samples) == frames


@dataclass
class ResumePlan:
    """What a run must do with the manifest rows, against the folder's records."""

    todo: list[ManifestRow]  # rows to synthesize (new, changed, failed before, or incomplete)
    done: list[str]  # ids skipped: complete and fingerprint unchanged
    redone: dict[str, list[str]]  # id -> changed fingerprint parts (rows that were complete)
    retried: list[str]  # ids whose earlier attempt failed or whose WAV is missing/torn
    foreign: list[str]  # ids in the folder that this manifest does not have (kept)

    def redone_counts(self) -> dict[str, int]:
        """Changed part -> rows ("text 3, seed 9"); a row changed in two parts counts in both."""
        counts: dict[str, int] = {}
        for parts in self.redone.values():
            for p in parts:
                counts[p] = counts.get(p, 0) + 1
        return counts

    def describe(self) -> str:
        bits = []
        if self.redone:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.redone_counts().items(), key=lambda kv: -kv[1]))
            bits.append(f"{len(self.redone)} rows redone: {counts}")
        if self.retried:
            bits.append(f"{len(self.retried)} rows retried (failed or incomplete before)")
        if self.foreign:
            bits.append(f"{len(self.foreign)} rows in the folder are not in this manifest (kept)")
        return "; ".join(bits)


def plan_resume(out_dir: Path, rows: Iterable[ManifestRow], fingerprints: Mapping[str, tuple[str, dict[str, str]]],
                *, records: Mapping[str, RowRecord], overwrite: bool = False) -> ResumePlan:
    """Decide per row: skip (complete, same fingerprint) or redo, and why, against the folder's
    ``records`` (read once by a run that plans its rows part by part). Foreign rows (in the folder,
    not in the manifest) are the caller's to find: only it has seen every part."""
    plan = ResumePlan(todo=[], done=[], redone={}, retried=[], foreign=[])
    for row in rows:
        rec = records.get(row.id)
        fp, parts = fingerprints[row.id]
        if rec is None:
            plan.todo.append(row)
            continue
        complete = is_complete(out_dir, rec)
        same = same_inputs(rec.fingerprint, rec.fingerprint_parts, fp, parts)
        if complete and not overwrite and same:
            plan.done.append(row.id)
            continue
        plan.todo.append(row)
        if not same and rec.ok:
            plan.redone[row.id] = changed_parts(rec.fingerprint_parts, parts)
        elif overwrite and complete:
            plan.redone[row.id] = ["overwrite"]
        else:
            plan.retried.append(row.id)
    return plan


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

def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in the folder ``path`` durable (or a file's written bytes: any path opens)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(path: Path) -> Path:
    """A temporary sibling of ``path`` naming this host and process (so a later run can clean it)."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` to a temporary file, fsync, rename over ``path``, fsync the directory.

    On any error the temporary file is removed and :class:`OutputFolderError` names the file and the
    system's reason (``No space left on device``, ``File too large``, ...): nothing torn is left.
    """
    tmp = tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputFolderError(f"cannot write {path}: {exc.strerror or exc}") from exc


def remove_stale_temporaries(out_dir: Path) -> list[Path]:
    """Remove temporary files left by dead processes of this host (a killed run); returns them."""
    host = socket.gethostname()
    removed = []
    for folder in (Path(out_dir), Path(out_dir) / WAV_DIR, state_dir(out_dir), state_dir(out_dir) / TOKEN_DIR):
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
        torn = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if torn:  # a killed run cut its last line: start on a fresh one (the torn line never parses)
            self._write(b"\n")

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as exc:
            raise OutputFolderError(f"cannot write {self.path}: {exc.strerror or exc}") from exc

    def append(self, obj: Mapping[str, Any]) -> None:
        self._write((json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def append_jsonl(path: Path, obj: Mapping[str, Any]) -> None:
    """One whole line appended to a shared log (runs, errors), fsynced."""
    j = Journal(path)
    try:
        j.append(obj)
    finally:
        j.close()


@contextlib.contextmanager
def _compaction_lock(out_dir: Path) -> Iterator[None]:
    """Serializes compaction between shard writers of one folder (same host or a POSIX-locking share)."""
    path = state_dir(out_dir) / "compact.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _order(records: Mapping[str, RowRecord]) -> list[RowRecord]:
    return [records[k] for k in sorted(records, key=lambda rid: (records[rid].line, rid))]


def compact(out_dir: Path, tag: str | None = None) -> dict[str, RowRecord]:
    """Merge ``diagnostics.jsonl`` and every journal into one record per row; rewrite ``metadata.jsonl``.

    ``tag``'s own journal is removed afterwards (other shards' journals stay: their writers may
    still append, and the next compaction reads them again). Torn lines are dropped here.
    """
    out_dir = Path(out_dir)
    with _compaction_lock(out_dir):
        records = read_records(out_dir)
        ordered = _order(records)
        lines = "".join(json.dumps(r.to_json(), ensure_ascii=False, sort_keys=True, default=str) + "\n"
                        for r in ordered)
        write_bytes_atomic(out_dir / DIAG_NAME, lines.encode())
        meta = "".join(json.dumps(metadata_line(r), ensure_ascii=False) + "\n" for r in ordered if r.ok)
        write_bytes_atomic(out_dir / METADATA_NAME, meta.encode())
        if tag is not None:
            with contextlib.suppress(FileNotFoundError):
                journal_path(out_dir, tag).unlink()
                fsync_dir(state_dir(out_dir))
    return records
