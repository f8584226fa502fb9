"""The end of a run in its folder: its journal appended to ``diagnostics.jsonl``, its rows' metadata.

Why append and not merge: a folder of millions of rows must not be read and rewritten because four
rows were added. The journal's whole lines are appended to ``diagnostics.jsonl`` as they are (a line
that does not parse, torn by a kill, is left out), the index is told where they now lie, and the
journal is removed. A kill in between leaves a record twice (the same line in both files), which
reads as one. Only the ``metadata.jsonl`` of the ``wavs/`` directories this run's rows left or
entered are written again, from the index (a few thousand rows a directory at ten million rows).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cosyclone.base.atomic import fsync_dir, tmp_name
from cosyclone.folder import layout as runfolder
from cosyclone.folder.columns import metadata_line
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.index_rows import meta_dir
from cosyclone.folder.record_line import RecordLine, parse_record
from cosyclone.folder.row_record import RowRecord

CHUNK_BYTES = 4 << 20  # journal bytes appended per write
STAGED_DIRS = 32  # metadata directories past which a settle stages them all and syncs the disk twice


def settle(
    out_dir: Path, tag: str, *, index: FolderIndex | None = None, touched: Iterable[str] = (),
    spool: Path | None = None,
) -> set[str]:
    """Append writer ``tag``'s journal to ``diagnostics.jsonl`` and remove it; write the metadata of the
    ``touched`` directories (:func:`~cosyclone.folder.index_rows.meta_dir` keys) and of those the
    journal's rows lie in. Returns the directories written. Raises
    :class:`~cosyclone.folder.layout.OutputFolderError`.

    ``spool``: the writer's metadata spool (:attr:`~cosyclone.folder.writer.BackgroundWriter.meta_spool`):
    the lines of the rows it committed, so that a night's directories are written without reading each
    record back (a fraction of a millisecond a row: a minute after a night of 100,000 rows); removed
    here. The directories are made on several threads; past :data:`STAGED_DIRS` of them, every file is
    staged first and the disk synced twice (:func:`_write_all_metadata`), not fsynced file by file."""
    out_dir = Path(out_dir)
    own = index is None
    with runfolder.settle_lock(out_dir):
        idx = index if index is not None else runfolder.open_index(out_dir)
        try:
            idx.sync(runfolder.record_sources(out_dir))  # other shards' lines, a killed run's
            dirs = set(touched) | _append_journal(out_dir, tag, idx)
            lines = read_spool(spool) if spool is not None else {}
            _write_all_metadata(out_dir, idx, sorted(dirs), lines)
        except sqlite3.Error as exc:
            raise runfolder.OutputFolderError(f"cannot write {idx.path}: {exc}") from exc
        finally:
            if own:
                idx.close()
            if spool is not None:
                spool.unlink(missing_ok=True)
    return dirs


def read_spool(path: Path) -> dict[str, str]:
    """A writer's metadata spool: row id -> its ``metadata.jsonl`` line (the last committed wins; a row
    committed without a file has none). An unreadable spool gives none: every line is read back."""
    lines: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for raw in fh:
                rid, _, text = raw.rstrip("\n").split("\t", 2)
                if text:
                    lines[json.loads(rid)] = text
                else:
                    lines.pop(json.loads(rid), None)
    except (OSError, ValueError):
        return {}
    return lines


def _append_journal(out_dir: Path, tag: str, index: FolderIndex) -> set[str]:
    """The journal's whole record lines onto ``diagnostics.jsonl``; the metadata directories they name."""
    journal = runfolder.journal_path(out_dir, tag)
    if not journal.is_file():
        return set()
    src = f"{runfolder.STATE_DIR}/{journal.name}"
    if index.whole_records(src):
        return _append_whole(out_dir, journal, src, index)
    diag = runfolder.Journal(out_dir / runfolder.DIAG_NAME)
    moved: list[tuple[str, int, int]] = []
    dirs: set[str] = set()
    try:
        chunk: list[bytes] = []
        size = 0
        where = diag.end
        with open(journal, "rb") as fh:
            offset = 0
            for raw in fh:
                here, offset = offset, offset + len(raw)
                rec = _record(raw)
                if rec is None:
                    continue
                moved.append((rec.id, here, where))
                where += len(raw)
                d = meta_dir(rec.file) if rec.ok else None
                if d is not None:
                    dirs.add(d)
                chunk.append(raw)
                size += len(raw)
                if size >= CHUNK_BYTES:
                    diag.append_line(b"".join(chunk))
                    chunk, size = [], 0
        if chunk:
            diag.append_line(b"".join(chunk))
        end = diag.end
    finally:
        diag.close()
    index.moved(src, runfolder.DIAG_NAME, moved, end)
    _remove(journal)
    return dirs


def _append_whole(out_dir: Path, journal: Path, src: str, index: FolderIndex) -> set[str]:
    """A journal the index read whole (every line a record): its bytes appended as they are, in chunks of
    whole lines, and the index's rows moved by one offset, with no line parsed (the run's end costs a
    copy, not a JSON parse and an index update per row). Same order of steps as line by line: the
    records down in ``diagnostics.jsonl``, then the index, then the journal removed."""
    dirs = index.dirs_in(src)
    diag = runfolder.Journal(out_dir / runfolder.DIAG_NAME)
    try:
        base = diag.end
        with open(journal, "rb") as fh:
            rest = b""
            while chunk := fh.read(CHUNK_BYTES):
                cut = chunk.rfind(b"\n") + 1
                if cut:  # whole lines only: a kill between two writes leaves no torn record
                    diag.append_line(rest + chunk[:cut])
                    rest = chunk[cut:]
                else:
                    rest += chunk
        if rest:  # never: the index read the whole file, so it ends a line
            diag.append_line(rest)
        end = diag.end
    finally:
        diag.close()
    index.moved_whole(src, runfolder.DIAG_NAME, base, end)
    _remove(journal)
    return dirs


def _remove(journal: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        journal.unlink()
        fsync_dir(journal.parent)


def _record(raw: bytes) -> RecordLine | None:
    """A whole journal line's record, None for a torn or foreign line."""
    return parse_record(raw) if raw.endswith(b"\n") else None


def _write_all_metadata(out_dir: Path, index: FolderIndex, dirs: list[str], lines: Mapping[str, str]) -> None:
    """The ``metadata.jsonl`` of ``dirs``. A few: each written atomically (its own fsyncs). Many (a night
    touches all 4,096 shards): every file's temporary written unsynced, one ``sync`` (every temporary
    down), the renames, one ``sync`` again (the renames down): two flushes of the disk, not 8,192
    fsyncs, with the same order per file: its bytes durable before its name points at them (a kill
    between leaves temporaries in ``wavs/``, which the next run removes)."""
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="cosyclone-metadata") as pool:
        if len(dirs) <= STAGED_DIRS:
            for done in [pool.submit(write_metadata, out_dir, index, d, lines) for d in dirs]:
                done.result()
            return
        jobs = [pool.submit(_stage_metadata, out_dir, index, d, lines) for d in dirs]
    staged = [(tmp, target) for job in jobs if job.exception() is None
              for tmp, target in [job.result()] if tmp is not None]
    try:
        for job in jobs:
            job.result()  # the first directory that failed, if one did (every temporary goes below)
        os.sync()  # Linux waits for the writes (and the unlinks of directories left empty)
        for tmp, target in staged:
            os.replace(tmp, target)
        os.sync()
    except BaseException as exc:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                tmp.unlink()  # (gone once renamed)
        if isinstance(exc, OSError):
            raise runfolder.OutputFolderError(f"cannot write the metadata of {len(dirs)} directories: "
                                              f"{exc.strerror or exc}") from exc
        raise


def _stage_metadata(out_dir: Path, index: FolderIndex, directory: str,
                    known: Mapping[str, str]) -> tuple[Path | None, Path]:
    """``directory``'s ``metadata.jsonl`` written unsynced to its temporary (None: it lists no row, and an
    earlier one was removed); with the file it goes to."""
    target, tmp = _metadata_paths(out_dir, directory)
    text = _metadata_text(out_dir, index, directory, known)
    if not text:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        return None, target
    staged = tmp_name(tmp if tmp is not None else target)
    try:
        staged.write_bytes(text.encode())
    except OSError as exc:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise runfolder.OutputFolderError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return staged, target


def _metadata_paths(out_dir: Path, directory: str) -> tuple[Path, Path | None]:
    """``directory``'s ``metadata.jsonl`` and the name its temporary is made from (in ``wavs/``: a killed
    run's are found there, one name per directory; None: beside it, for the folder's root)."""
    target = (out_dir / directory if directory else out_dir) / runfolder.METADATA_NAME
    flat = directory.replace("/", "-")
    return target, out_dir / runfolder.WAV_DIR / f"{flat}-{target.name}" if directory else None


def write_metadata(out_dir: Path, index: FolderIndex, directory: str,
                   known: Mapping[str, str] | None = None) -> None:
    """``directory``'s ``metadata.jsonl`` (``""``: the folder's root, for flat files) from the index,
    atomically (:func:`_metadata_text`); removed when it lists no row."""
    target, tmp = _metadata_paths(out_dir, directory)
    text = _metadata_text(out_dir, index, directory, known)
    if text:
        runfolder.write_bytes_atomic(target, text.encode(), tmp=tmp)
    elif target.exists():
        target.unlink()
        fsync_dir(target.parent)


def _metadata_text(out_dir: Path, index: FolderIndex, directory: str, known: Mapping[str, str] | None) -> str:
    """One line per ``ok`` row whose file lies in ``directory``, manifest order. ``known``: lines this
    process committed (row id -> line), taken as they are instead of reading the record."""
    base = out_dir / directory if directory else out_dir
    lines = []
    for row in index.in_dir(directory):
        text = known.get(row.id) if known is not None else None
        if text is not None:
            lines.append(text + "\n")
            continue
        held = index.record(row)
        rec = RowRecord.from_json(held) if held is not None else None
        path = runfolder.audio_path(out_dir, row)
        if rec is None or path is None:
            continue
        name = path.relative_to(base).as_posix()
        lines.append(json.dumps(metadata_line(rec, name), ensure_ascii=False) + "\n")
    return "".join(lines)
