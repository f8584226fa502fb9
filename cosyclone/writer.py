"""Output files: ``wavs/<id>.wav``, ``diagnostics.jsonl`` and ``summary.json``.

Crash safety is by construction: a WAV is written to a temporary name in the same folder and
renamed (atomic on POSIX), and only *then* is the row's diagnostics line appended whole and
flushed. A row therefore counts as done exactly when its diagnostics line says ``ok`` and its WAV
exists, which is what :func:`completed_rows` checks on resume. A line cut by a kill is ignored (it
does not parse) and the next append starts on a fresh line.

:class:`BackgroundWriter` runs the file work on its own thread so the model never waits on disk.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 24000
DIAG_NAME = "diagnostics.jsonl"
SUMMARY_NAME = "summary.json"
WAV_DIR = "wavs"


@dataclass(frozen=True)
class WriterOptions:
    """How results are written."""

    out_dir: Path  # root of all outputs
    float_wav: bool = False  # 32-bit float WAV instead of PCM16
    sample_rate: int = SAMPLE_RATE  # sample rate written into the WAV header


@dataclass
class RowRecord:
    """One row's outcome: the audio (None for a failed row) and its diagnostics line."""

    row_id: str  # manifest id
    wav: np.ndarray | None  # (N,) float32 in [-1, 1], None when the row failed
    diagnostics: dict[str, Any] = field(default_factory=dict)  # the diagnostics.jsonl object


def wav_path(out_dir: Path, row_id: str) -> Path:
    return Path(out_dir) / WAV_DIR / f"{row_id}.wav"


def write_wav_atomic(path: Path, wav: np.ndarray, *, sample_rate: int, float_wav: bool) -> None:
    """Write ``wav`` to ``path`` through a temporary file and an atomic rename.

    Samples are clipped to [-1, 1]; a non-finite sample is refused, never silently zeroed: the
    pipeline decides what NaN/inf audio means (``--nonfinite-audio``) and counts it per row.
    """
    import soundfile as sf

    data = np.asarray(wav, dtype=np.float32).reshape(-1)
    if not np.isfinite(data).all():
        raise ValueError(f"{path.name}: {int((~np.isfinite(data)).sum())} non-finite samples reached the writer "
                         "(the pipeline fails such rows or zeroes them under --nonfinite-audio zero)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = np.clip(data, -1.0, 1.0)
    sf.write(str(tmp), data, sample_rate, subtype="FLOAT" if float_wav else "PCM_16", format="WAV")
    os.replace(tmp, path)


def read_diagnostics(out_dir: Path) -> dict[str, dict[str, Any]]:
    """The last complete diagnostics line per row id (lines that do not parse are skipped)."""
    path = Path(out_dir) / DIAG_NAME
    found: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return found
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            found[obj["id"]] = obj
    return found


def completed_rows(out_dir: Path, ids: Iterable[str]) -> set[str]:
    """Ids whose diagnostics line says ``ok`` and whose WAV exists: these are skipped on resume."""
    diags = read_diagnostics(out_dir)
    done = set()
    for rid in ids:
        d = diags.get(rid)
        if d is not None and d.get("status") == "ok" and wav_path(out_dir, rid).is_file():
            done.add(rid)
    return done


class DiagnosticsLog:
    """Append-only JSONL: each line written whole and flushed (and fsynced) before returning."""

    def __init__(self, path: Path, *, truncate: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if truncate and path.exists():
            path.unlink()
        needs_newline = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if needs_newline:  # a previous run was killed mid-line: start clean
            self._fh.write("\n")
            self._fh.flush()

    def append(self, obj: dict[str, Any]) -> None:
        self._fh.write(json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


class BackgroundWriter:
    """Writes :class:`RowRecord`s on a worker thread; ``close()`` waits and re-raises its error."""

    def __init__(self, options: WriterOptions, *, truncate: bool = False, max_queue: int = 64) -> None:
        self.options = options
        self._log = DiagnosticsLog(Path(options.out_dir) / DIAG_NAME, truncate=truncate)
        (Path(options.out_dir) / WAV_DIR).mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[RowRecord | None] = queue.Queue(maxsize=max_queue)
        self._error: BaseException | None = None
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
            except BaseException as exc:  # surfaced by close()
                self._error = exc

    def write_now(self, rec: RowRecord) -> None:
        """WAV first (atomic), then its diagnostics line: the line is the commit record."""
        if rec.wav is not None:
            write_wav_atomic(wav_path(self.options.out_dir, rec.row_id), rec.wav,
                             sample_rate=self.options.sample_rate, float_wav=self.options.float_wav)
        self._log.append(rec.diagnostics)

    def submit(self, rec: RowRecord) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(rec)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._log.close()
        if self._error is not None:
            raise self._error


def write_summary(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``summary.json``, written atomically."""
    path = Path(out_dir) / SUMMARY_NAME
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def render_summary(summary: dict[str, Any], *, tty: bool) -> None:
    """A rich table on a terminal; a few plain ``key: value`` lines otherwise."""
    keys = [("rows", "rows in run"), ("done", "rows ok"), ("skipped", "resumed (skipped)"),
            ("failed", "rows failed"), ("invalid", "invalid manifest rows"), ("audio_seconds", "audio s"),
            ("wall_seconds", "wall s"), ("rtf", "real-time factor"), ("nan_summary", "sampler"),
            ("nonfinite_audio_samples", "non-finite audio samples"),
            ("out_dir", "outputs")]
    if tty:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="cosyclone synth", show_header=False)
        for key, label in keys:
            table.add_row(label, _fmt(summary.get(key)))
        Console().print(table)
    else:
        for key, label in keys:
            print(f"{label}: {_fmt(summary.get(key))}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)
