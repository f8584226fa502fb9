"""Output files of a run: ``wavs/<shard>/<id>.wav`` and the row records (see :mod:`cosyclone.folder.layout`).

Crash safety is by construction: a WAV is encoded in memory, written to a temporary name in the
same folder, fsynced and renamed (atomic on POSIX), the directory fsynced, and only *then* is the
row's record appended whole to this writer's journal and fsynced. A row therefore counts as done
exactly when its record says ``ok`` and its WAV holds the recorded samples; the folder's index hears
of the row after its record is down (:mod:`cosyclone.folder.index`). A write that fails
(disk full, permission) removes its temporary file and stops the run with
:class:`~cosyclone.folder.layout.OutputFolderError`.

:class:`BackgroundWriter` runs the file work on its own thread so the model never waits on disk.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.base.atomic import fsync_dir, tmp_name
from cosyclone.engine import RowResult
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import SUFFIXES, AudioOutput, process
from cosyclone.folder.columns import metadata_line
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.index_rows import meta_dir
from cosyclone.folder.row_record import NO_FILE, FileFacts, RowRecord, RowStamp, make_record

SAMPLE_RATE = 24000
SUMMARY_NAME = "summary.json"
WAV_DIR = runfolder.WAV_DIR


@dataclass(frozen=True)
class WriterOptions:
    """How results are written."""

    out_dir: Path  # root of all outputs
    output: AudioOutput = AudioOutput()  # rate, container, encoding and trimming of the files
    model_rate: int = SAMPLE_RATE  # the rate of the samples the engine hands over (the model's)


wav_path = runfolder.wav_path  # one definition of where a row's WAV lies


def write_audio_atomic(path: Path, wav: np.ndarray, *, model_rate: int, output: AudioOutput,
                       tmp_dir: Path | None = None) -> FileFacts:
    """``wav`` (the model's samples at ``model_rate``) as ``output`` asks, to ``path``, durably:
    temporary file, fsync, rename, directory fsync. Non-finite samples are refused (``ValueError``)."""
    try:
        data, facts = process(wav, model_rate=model_rate, out=output)
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    runfolder.write_bytes_atomic(path, data, tmp_dir=tmp_dir)
    return facts


class BackgroundWriter:
    """Writes finished rows on a worker thread; ``close()`` waits and re-raises its error.

    Each row's file goes first (atomic), then its :class:`RowRecord` to ``journal`` (this writer's
    journal in the folder): the record is the commit. A failed row's stale file from an earlier
    attempt is removed (its record now says why there is none), and the traceback of a non-user
    error moves to ``errors.jsonl`` so the row records stay readable.

    Rows are committed in groups (what is queued when the thread takes the next, up to ``group``):
    the group's files are written on ``file_threads`` threads, whose fsyncs the disk folds into a few
    flushes, then its records go down with one journal fsync and one index transaction. An fsync
    costs milliseconds on network or virtual disks; one per file in turn capped a night at tens of
    rows a second. The order of the steps per row is unchanged (file durable, then record), so a
    killed run leaves the same guarantees. ``on_commit`` hears of each record once it is down (the
    run drops the row's stage-0 tokens there).
    """

    def __init__(self, options: WriterOptions, journal: Path, *, index: FolderIndex | None = None,
                 max_queue: int = 256, group: int = 64, file_threads: int = 16,
                 on_commit: Callable[[RowRecord], None] | None = None, spool_metadata: bool = False) -> None:
        """``spool_metadata``: keep each committed row's ``metadata.jsonl`` line in :attr:`meta_spool`, so
        that the run's end writes its directories without reading every record back."""
        self.options = options
        self._journal = runfolder.Journal(journal)
        # without one given, the folder's is opened here and closed by close()
        self._own_index = index is None
        self.index = index if index is not None else runfolder.open_index(options.out_dir)
        self._src = journal.relative_to(options.out_dir).as_posix()
        self.index.track(self._src)
        self.touched: set[str] = set()  # metadata directories whose rows this writer changed
        (Path(options.out_dir) / WAV_DIR).mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[tuple[RowResult, RowStamp] | RowRecord | None] = queue.Queue(
            maxsize=max_queue
        )
        self.group = max(1, group)
        self.on_commit = on_commit
        # the committed rows' metadata lines (row id, directory, line), appended as they commit, no fsync: a
        # temporary of this process (a killed run's goes), read once by the run's end (settle.read_spool)
        self.meta_spool = tmp_name(journal.with_name(f"{journal.stem}.metadata"))
        self._spool = self.meta_spool.open("w", encoding="utf-8") if spool_metadata else None
        self._files = ThreadPoolExecutor(max_workers=max(1, file_threads),
                                         thread_name_prefix="cosyclone-file")
        self._error: BaseException | None = None
        self.written = 0
        self.written_ids: set[str] = set()  # the rows this writer made (a run's own work, not the folder's)
        self._thread = threading.Thread(target=self._work, name="cosyclone-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            group, last = [item], False
            while len(group) < self.group and not last:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    last = True
                else:
                    group.append(nxt)
            if self._error is None:
                try:
                    self._write_group(group)
                except BaseException as exc:  # surfaced by submit() / close()
                    self._error = exc
            if last:
                return

    def _write_group(self, group: list[tuple[RowResult, RowStamp] | RowRecord]) -> None:
        """The group's files on the file threads, then every record whose file is down (in order), then
        the first error, if any (the rows after it whose files were written keep their records)."""
        pending = [item if isinstance(item, RowRecord) else self._files.submit(self._file, item[0])
                   for item in group]
        records: list[tuple[RowRecord, bool]] = []  # (record, whether this writer made its row)
        error: BaseException | None = None
        for item, job in zip(group, pending, strict=True):
            try:
                if isinstance(job, RowRecord):
                    records.append((job, False))
                else:
                    assert not isinstance(item, RowRecord)
                    records.append((self._record(*item, facts=job.result()), True))
            except BaseException as exc:
                error = error or exc
        self._commit_all(records)
        if error is not None:
            raise error

    def write_now(self, result: RowResult, stamp: RowStamp) -> RowRecord:
        """The row's file first (atomic), then its record: the record is the commit."""
        record = self._record(result, stamp, facts=self._file(result))
        self._commit_all([(record, True)])
        return record

    def _file(self, result: RowResult) -> FileFacts:
        """The row's file, durable (or, for a row without audio, its stale files from earlier removed)."""
        out, output = Path(self.options.out_dir), self.options.output
        path = wav_path(out, result.id, output.suffix)
        facts = NO_FILE
        if result.ok and result.audio is not None:
            written = write_audio_atomic(
                path, result.audio, model_rate=self.options.model_rate, output=output, tmp_dir=out / WAV_DIR
            )
            facts = replace(written, file=str(path.relative_to(out)))
        _remove_other_files(out, result.id, keep=path if facts.file else None)
        return facts

    def _record(self, result: RowResult, stamp: RowStamp, *, facts: FileFacts) -> RowRecord:
        note = None
        if result.traceback:
            out = Path(self.options.out_dir)
            runfolder.append_jsonl(out / runfolder.ERRORS_NAME,
                                   {"id": result.id, "run_id": stamp.run_id, "time": time.time(),
                                    "error_type": result.error_type, "error": result.error,
                                    "traceback": result.traceback})
            note = f"see {runfolder.ERRORS_NAME}"
        return make_record(result, stamp, facts, traceback_note=note)

    def _commit_all(self, records: list[tuple[RowRecord, bool]]) -> None:
        """The records down in the journal (the commit: one fsync), then the index told where they lie
        (one transaction); ``True`` beside a record: a row this writer made (not a restamp)."""
        if not records:
            return
        lines = [record.to_json() for record, _ in records]
        encoded = [runfolder.encode_line(line) for line in lines]
        offsets = self._journal.append_all(encoded)
        try:
            was = self.index.put_many(lines, self._src, offsets, self._journal.end)
        except sqlite3.Error as exc:  # a full disk: the records stand, the next run indexes them
            raise runfolder.OutputFolderError(f"cannot write {self.index.path}: {exc}") from exc
        if self._spool is not None:
            self._spool.write("".join(_spool_line(record, line) for (record, _), line in zip(records, encoded,
                                                                                               strict=True)))
        for (record, made), before in zip(records, was, strict=True):
            here = meta_dir(record.file) if record.ok else None
            self.touched.update(d for d in (before, here) if d is not None)
            if made:
                self.written += 1
                self.written_ids.add(record.id)
            if self.on_commit is not None:
                self.on_commit(record)

    def submit(self, result: RowResult, stamp: RowStamp) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((result, stamp))

    def restamp(self, record: RowRecord) -> None:
        """Commit ``record`` again as it is (its file untouched): a done row whose ``meta`` the manifest
        changed keeps its audio, and its record, metadata.jsonl and exports take the new values."""
        if self._error is not None:
            raise self._error
        self._queue.put(record)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._files.shutdown(wait=True)
        self._journal.close()
        if self._spool is not None:
            self._spool.close()
        if self._own_index:
            self.index.close()
        if self._error is not None:
            raise self._error


def _spool_line(record: RowRecord, line: bytes) -> str:
    """A committed row's metadata spool line: its id (JSON), its directory and its ``metadata.jsonl`` line
    (empty: the row has no file now), tab-separated (JSON text holds no tab or newline). ``line``: its
    journal line."""
    directory = meta_dir(record.file) if record.ok else None
    text = ""
    if directory is not None and record.file:
        name = record.file if directory == "" else record.file[len(directory) + 1:]
        # as the record reads back from its line (what a directory's lines are otherwise made from)
        back = RowRecord.from_json(json.loads(line))
        text = json.dumps(metadata_line(back, name), ensure_ascii=False) if back is not None else ""
    return f"{json.dumps(record.id)}\t{directory or ''}\t{text}\n"


def _remove_other_files(out: Path, row_id: str, *, keep: Path | None) -> None:
    """A row's files from earlier attempts in another format (or any, for a failed row) are removed:
    its record now names the one file it has, or says why there is none."""
    for suffix in SUFFIXES.values():
        for stale in (wav_path(out, row_id, suffix), runfolder.flat_path(out, row_id, suffix)):
            if stale != keep and stale.exists():
                stale.unlink()
                fsync_dir(stale.parent)


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``summary.json``, written atomically."""
    path = Path(out_dir) / SUMMARY_NAME
    runfolder.write_bytes_atomic(
        path, (json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n").encode()
    )
    return path
