"""Output files of a run: ``wavs/<id>.wav`` and the row records (see :mod:`cosyclone.run.folder`).

Crash safety is by construction: a WAV is encoded in memory, written to a temporary name in the
same folder, fsynced and renamed (atomic on POSIX), the directory fsynced, and only *then* is the
row's record appended whole to this writer's journal and fsynced. A row therefore counts as done
exactly when its record says ``ok`` and its WAV holds the recorded samples. A write that fails
(disk full, permission) removes its temporary file and stops the run with
:class:`~cosyclone.run.folder.OutputFolderError`.

:class:`BackgroundWriter` runs the file work on its own thread so the model never waits on disk.
"""

from __future__ import annotations

import json
import queue
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.engine import RowResult
from cosyclone.run import folder as runfolder
from cosyclone.run.row_record import NO_FILE, FileFacts, RowRecord, RowStamp, make_record

SAMPLE_RATE = 24000
SUMMARY_NAME = "summary.json"
WAV_DIR = runfolder.WAV_DIR


@dataclass(frozen=True)
class WriterOptions:
    """How results are written."""

    out_dir: Path  # root of all outputs
    float_wav: bool = False  # 32-bit float WAV instead of PCM16
    sample_rate: int = SAMPLE_RATE  # sample rate written into the WAV header


wav_path = runfolder.wav_path  # one definition of where a row's WAV lies


def encode_wav(wav: np.ndarray, *, sample_rate: int, float_wav: bool) -> bytes:
    """The WAV file's bytes: mono PCM16 (``round(x * 32767)``) or IEEE float32, samples clipped to [-1, 1].

    Written here rather than by libsndfile because its float files carry a PEAK chunk with the
    time of writing, so the same audio gave different bytes on every run. A non-finite sample is
    refused, never silently zeroed: the pipeline decides what NaN/inf audio means
    (``--nonfinite-audio``) and counts it per row.
    """
    data = np.asarray(wav, dtype=np.float32).reshape(-1)
    if not np.isfinite(data).all():
        raise ValueError(f"{int((~np.isfinite(data)).sum())} non-finite samples reached the writer "
                         "(the pipeline fails such rows or zeroes them under --nonfinite-audio zero)")
    data = np.clip(data, -1.0, 1.0)
    if float_wav:
        body, fmt_tag, width = data.astype("<f4").tobytes(), 3, 4  # WAVE_FORMAT_IEEE_FLOAT
        fmt = struct.pack("<HHIIHHH", fmt_tag, 1, sample_rate, sample_rate * width, width, 8 * width, 0)
        extra = b"fact" + struct.pack("<II", 4, data.size)  # non-PCM formats carry a fact chunk
    else:
        body, fmt_tag, width = np.rint(data * 32767.0).astype("<i2").tobytes(), 1, 2  # WAVE_FORMAT_PCM
        fmt = struct.pack("<HHIIHH", fmt_tag, 1, sample_rate, sample_rate * width, width, 8 * width)
        extra = b""
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def write_wav_atomic(path: Path, wav: np.ndarray, *, sample_rate: int, float_wav: bool) -> None:
    """Write ``wav`` to ``path`` durably: temporary file, fsync, rename, directory fsync."""
    try:
        data = encode_wav(wav, sample_rate=sample_rate, float_wav=float_wav)
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    runfolder.write_bytes_atomic(path, data)


class BackgroundWriter:
    """Writes finished rows on a worker thread; ``close()`` waits and re-raises its error.

    Each row's file goes first (atomic), then its :class:`RowRecord` to ``journal`` (this writer's
    journal in the folder): the record is the commit. A failed row's stale file from an earlier
    attempt is removed (its record now says why there is none), and the traceback of a non-user
    error moves to ``errors.jsonl`` so the row records stay readable.
    """

    def __init__(self, options: WriterOptions, journal: Path, *, max_queue: int = 64) -> None:
        self.options = options
        self._journal = runfolder.Journal(journal)
        (Path(options.out_dir) / WAV_DIR).mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[tuple[RowResult, RowStamp] | None] = queue.Queue(maxsize=max_queue)
        self._error: BaseException | None = None
        self.written = 0
        self._thread = threading.Thread(target=self._work, name="cosyclone-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue
            try:
                self.write_now(*item)
            except BaseException as exc:  # surfaced by submit() / close()
                self._error = exc

    def write_now(self, result: RowResult, stamp: RowStamp) -> RowRecord:
        """The row's file first (atomic), then its record: the record is the commit."""
        out = Path(self.options.out_dir)
        path = wav_path(out, result.id)
        facts = NO_FILE
        if result.ok and result.audio is not None:
            write_wav_atomic(path, result.audio, sample_rate=self.options.sample_rate,
                             float_wav=self.options.float_wav)
            facts = FileFacts(file=str(path.relative_to(out)), samples=int(np.asarray(result.audio).size),
                              sample_rate=self.options.sample_rate, audio_format="wav",
                              encoding="float" if self.options.float_wav else "pcm16",
                              trimmed_lead_seconds=0.0, trimmed_trail_seconds=0.0)
        elif path.exists():
            path.unlink()
            runfolder.fsync_dir(path.parent)
        note = None
        if result.traceback:
            runfolder.append_jsonl(out / runfolder.ERRORS_NAME,
                                   {"id": result.id, "run_id": stamp.run_id, "time": time.time(),
                                    "error_type": result.error_type, "error": result.error,
                                    "traceback": result.traceback})
            note = f"see {runfolder.ERRORS_NAME}"
        record = make_record(result, stamp, facts, traceback_note=note)
        self._journal.append(record.to_json())
        self.written += 1
        return record

    def submit(self, result: RowResult, stamp: RowStamp) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((result, stamp))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._journal.close()
        if self._error is not None:
            raise self._error


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``summary.json``, written atomically."""
    path = Path(out_dir) / SUMMARY_NAME
    runfolder.write_bytes_atomic(path, (json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n").encode())
    return path
