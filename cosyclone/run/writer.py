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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.outcome import RowRecord
from . import folder as runfolder
from .audio_out import encode_wav  # noqa: F401  (moved to audio_out with PCM24 and FLAC; this name stays)

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


def write_wav_atomic(path: Path, wav: np.ndarray, *, sample_rate: int, float_wav: bool) -> None:
    """Write ``wav`` to ``path`` durably: temporary file, fsync, rename, directory fsync."""
    try:
        data = encode_wav(wav, sample_rate=sample_rate, float_wav=float_wav)
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    runfolder.write_bytes_atomic(path, data)


class BackgroundWriter:
    """Writes :class:`RowRecord`s on a worker thread; ``close()`` waits and re-raises its error.

    Records go to ``journal`` (this writer's journal in the folder); a failed row's stale WAV from
    an earlier attempt is removed (its record now says why there is none), and the traceback of a
    non-user error moves to ``errors.jsonl`` so the row records stay readable.
    """

    def __init__(self, options: WriterOptions, journal: Path, *, max_queue: int = 64) -> None:
        self.options = options
        self._journal = runfolder.Journal(journal)
        (Path(options.out_dir) / WAV_DIR).mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[RowRecord | None] = queue.Queue(maxsize=max_queue)
        self._error: BaseException | None = None
        self.written = 0
        self._thread = threading.Thread(target=self._work, name="cosyclone-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            rec = self._queue.get()
            if rec is None:
                return
            if self._error is not None:
                continue
            try:
                self.write_now(rec)
            except BaseException as exc:  # surfaced by submit() / close()
                self._error = exc

    def write_now(self, rec: RowRecord) -> None:
        """WAV first (atomic), then its record: the record is the commit."""
        out = Path(self.options.out_dir)
        d = dict(rec.diagnostics)
        path = wav_path(out, rec.row_id)
        if rec.wav is not None:
            write_wav_atomic(path, rec.wav, sample_rate=self.options.sample_rate, float_wav=self.options.float_wav)
            d["samples"], d["sample_rate"] = int(np.asarray(rec.wav).size), self.options.sample_rate
        elif path.exists():
            path.unlink()
            runfolder.fsync_dir(path.parent)
        tb = d.pop("traceback", None)
        if tb:
            runfolder.append_jsonl(out / runfolder.ERRORS_NAME,
                                   {"id": rec.row_id, "run_id": d.get("run_id"), "time": time.time(),
                                    "error_type": d.get("error_type"), "error": d.get("error"), "traceback": tb})
            d["traceback"] = f"see {runfolder.ERRORS_NAME}"
        d.setdefault("finished_at", time.time())
        self._journal.append(d)
        self.written += 1

    def submit(self, rec: RowRecord) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(rec)

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
