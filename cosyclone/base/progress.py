"""Progress that moves: a bar per finished row on a terminal, a plain line every N seconds in a log.

A nightly job's stderr is a file, where a redrawn bar prints nothing useful; there a line such as
``synth: 12/240 rows (5%), 11 done, 1 failed, 0.41 rows/s, 3.2 audio-s/s, ETA 9m16s, elapsed 29s``
appears every ``interval`` seconds (and once at the end), so a log shows the run is alive and a
script can read how far it got. A timer thread drives both, so the line comes on time (and the
elapsed time moves) while a long batch is still in the model.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol, TextIO


def _duration(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class FinishedRow(Protocol):
    """What progress reads of a finished row."""

    @property
    def ok(self) -> bool: ...

    @property
    def audio_seconds(self) -> float: ...


class Progress:
    """Counts finished rows and their audio; shows rows/s, audio-s/s and ETA."""

    def __init__(self, total: int, *, stream: TextIO | None = None, tty: bool | None = None,
                 interval: float = 30.0, quiet: bool = False, label: str = "synth") -> None:
        self.total, self.label, self.interval = total, label, interval
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.quiet = quiet or total == 0
        self.rows = self.failed = 0
        self.audio_seconds = 0.0
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar: Any = None
        if not self.quiet and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="row", file=self.stream, dynamic_ncols=True)
        self._thread: threading.Thread | None = None
        if not self.quiet:
            self._thread = threading.Thread(target=self._tick, name="cosyclone-progress", daemon=True)
            self._thread.start()

    def update(self, row: FinishedRow) -> None:
        """One finished row (a :class:`~cosyclone.engine.RowResult`)."""
        with self._lock:
            self.rows += 1
            if row.ok:
                self.audio_seconds += float(row.audio_seconds)
            else:
                self.failed += 1
            if self._bar is not None:
                failed = f", {self.failed} failed" if self.failed else ""
                self._bar.set_postfix_str(self._rates() + failed, refresh=False)
                self._bar.update(1)

    def exclude(self, rows: int) -> None:
        """``rows`` of the total will not be made here (rejected lines, rows already done): a run that
        reads its manifest as it goes starts from the line count and learns these part by part."""
        with self._lock:
            self.total = max(self.rows, self.total - rows)
            if self._bar is not None:
                self._bar.total = self.total
                self._bar.refresh()

    def _rates(self) -> str:
        wall = max(1e-9, time.perf_counter() - self._t0)
        rate = self.rows / wall
        eta = (self.total - self.rows) / rate if rate > 0 else None
        return (f"{rate:.2f} rows/s, {self.audio_seconds / wall:.2f} audio-s/s, "
                f"ETA {_duration(eta) if eta is not None else '?'}")

    def line(self) -> str:
        """The plain log line of the current state: rows finished of all, done and failed, rates, ETA."""
        with self._lock:
            pct = 100.0 * self.rows / self.total if self.total else 100.0
            return (
                f"{self.label}: {self.rows}/{self.total} rows ({pct:.0f}%), {self.rows - self.failed} done, "
                f"{self.failed} failed, {self._rates()}, elapsed {_duration(time.perf_counter() - self._t0)}"
            )

    def _tick(self) -> None:
        period = 1.0 if self.tty else self.interval
        while not self._stop.wait(period):
            if self._bar is not None:
                with self._lock:
                    self._bar.refresh()
            else:
                print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        elif not self.quiet:
            print(self.line(), file=self.stream, flush=True)
