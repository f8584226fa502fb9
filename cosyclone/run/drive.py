"""The one driver loop of a run: rows from a source, each stamped, written, counted and shown.

Why one loop: the local engine and the Ray actor pool used to have a loop each (stamping, the
writer, progress, the records kept), near copies that drifted. Here a :class:`RowSource` is the
only thing that differs: this process's engine (:class:`LocalSource`) or Ray's actors
(:class:`cosyclone.ray.pool.RaySource`). The loop takes the run's parts as they are read,
hands each part's planned batches to the source and commits every result that comes back: the
row's stamp (what made it), the writer (file, then record), the tally (this run's figures) and
the progress sink. A stop request ends the feeding; what the source already holds is drained
(the source itself stops admitting rows and lets those in flight finish), or dropped once the
request turns immediate (a second signal, the grace period spent): the loop looks at it after
every result, and the sources look at it while they wait.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from cosyclone.base.stop import StopRequest
from cosyclone.engine import Engine, RowResult
from cosyclone.engine.isolation import TokenCheckpoint
from cosyclone.engine.schedule import StageSchedule
from cosyclone.folder import layout as runfolder
from cosyclone.folder.row_record import RowStamp
from cosyclone.manifest import Manifest, ManifestRow
from cosyclone.options import RunOptions
from cosyclone.run.account import RunTally
from cosyclone.run.job_types import Prepared, ProgressSink
from cosyclone.run.parts import plan_parts


class RowSource(Protocol):
    """Where a run's rows are made: batches in, results out (audio included), in any order."""

    @property
    def graph_errors(self) -> list[str]:
        """Why CUDA graph captures failed (each reason once)."""
        ...

    @property
    def hits(self) -> int:
        """Segments whose talker result came from the stage-0 checkpoint."""
        ...

    def feed(self, batches: Sequence[Sequence[ManifestRow]]) -> Iterator[RowResult]:
        """Take ``batches`` (one part's plan); yield the results that are ready now."""
        ...

    def drain(self) -> Iterator[RowResult]:
        """Yield every result still outstanding (after the last part, or after a stop)."""
        ...

    def cancel(self) -> None:
        """Drop every outstanding batch (a second signal, or the grace period ran out)."""
        ...

    def close(self) -> None:
        """Free what the source holds (a Ray pool's actors and its connection); called once, at the end."""
        ...


class LocalSource:
    """Rows made by this process's engine, loaded at the first batch (a resumed run may need none).

    One pipeline for the whole run: the first part opens it, every part feeds it and :meth:`drain`
    finishes it, so its prompt workers and talker session live across parts (a part's tail is still
    decoding while the next part's first rows are prepared)."""

    def __init__(self, load: Callable[[], Engine], opts: RunOptions, tokens: TokenCheckpoint | None,
                 stop: StopRequest | None = None) -> None:
        self._load, self.opts, self.tokens, self.stop = load, opts, tokens, stop
        self.engine: Engine | None = None
        self.graph_errors: list[str] = []
        self.pipeline: StageSchedule | None = None

    @property
    def hits(self) -> int:
        return int(getattr(self.tokens, "hits", 0))

    def feed(self, batches: Sequence[Sequence[ManifestRow]]) -> Iterator[RowResult]:
        # no model loaded for a stopped run
        if not batches or (self.stop is not None and self.stop.requested):
            return
        if self.engine is None:
            self.engine = self._load()
            self.graph_errors = self.engine.graph_errors
        if self.pipeline is None:
            # records in any order: a batch goes to code2wav once its own segments are out
            self.pipeline = self.engine.pipeline(opts=self.opts, tokens=self.tokens, stop=self.stop,
                                                 ordered=False)
        yield from self.pipeline.feed(batches)

    def drain(self) -> Iterator[RowResult]:
        if self.pipeline is None:
            return
        try:
            yield from self.pipeline.drain()
        finally:
            self.cancel()

    def cancel(self) -> None:
        pipeline, self.pipeline = self.pipeline, None
        if pipeline is not None:
            pipeline.close()  # its workers stop and its talker session is freed

    def close(self) -> None:
        self.cancel()


@dataclass
class DriveEnd:
    """How the loop ended."""

    write_error: str | None  # why a write failed (the loop stopped there; rows written before are kept)
    stopped_by: str | None  # the signal that stopped it early (None: every part ran)


class Driver:
    """Commits results: the writer, the tally, progress. One per run."""

    def __init__(
        self,
        submit: Callable[[RowResult, RowStamp], None],
        tally: RunTally,
        sink: ProgressSink | None,
        stamp: Callable[[RowResult], RowStamp],
    ) -> None:
        self.submit, self.tally, self.sink, self.stamp = submit, tally, sink, stamp

    def commit(self, result: RowResult) -> None:
        """One finished row: written (file, then record), counted, shown."""
        self.submit(result, self.stamp(result))
        self.tally.add(result)
        if self.sink is not None:
            self.sink.update(result)

    def drive(self, parts: Iterable[tuple[Manifest, Prepared]], source: RowSource, *, batch_size: int,
              token_budget: int | None, stop: StopRequest | None = None,
              on_part: Callable[[Manifest, Prepared], None] | None = None) -> DriveEnd:
        """Every part through ``source``; returns why it stopped (a write error, a signal, or the end).

        After a stop request no part is fed; once it is immediate, the results the source still
        holds are dropped (:meth:`RowSource.cancel`), unrecorded: they run on the resume.
        """
        todo = PartsAhead(parts)
        try:
            while True:
                if stop is not None and stop.requested:  # no part is fed after a stop request
                    break
                item = todo.next()
                if item is None:
                    break
                part, prep = item
                if on_part is not None:
                    on_part(part, prep)
                for result in prep.failed:  # rows that failed before any stage (their fingerprint)
                    self.commit(result)
                if not self._commit_all(source.feed(plan_parts([prep.resume.todo], batch_size, token_budget)),
                                        stop):
                    break
            if stop is None or not stop.immediate:
                self._commit_all(source.drain(), stop)
            if stop is not None and stop.immediate:
                source.cancel()
        except runfolder.OutputFolderError as exc:
            source.cancel()
            return DriveEnd(write_error=str(exc), stopped_by=stop.signal_name if stop is not None else None)
        finally:
            todo.close()  # (a streamed manifest's reader stops its normalizing pool)
            self.tally.hits = source.hits
        return DriveEnd(write_error=None, stopped_by=stop.signal_name if stop is not None else None)

    def _commit_all(self, results: Iterator[RowResult], stop: StopRequest | None) -> bool:
        """Commit ``results`` until they end (True) or a stop turns immediate (False: the rest is dropped)."""
        for result in results:
            self.commit(result)
            if stop is not None and stop.immediate:
                _close_iter(results)  # the engine's finally blocks run now: it frees its talker session
                return False
        return True


class PartsAhead:
    """The run's parts read, validated, fingerprinted and planned against the index one part ahead, on
    a thread of their own: the thread that steps the talker takes each part ready (a part of 2048 lines
    costs a second or more of the host's time, and the talker's slots would sit idle meanwhile).

    :meth:`close` stops the reading: it waits for the part being read (if any) to be done, then closes
    the iterator on this thread (its ``finally`` blocks run here: a streamed reader's pool stops)."""

    def __init__(self, parts: Iterable[tuple[Manifest, Prepared]]) -> None:
        self._it = iter(parts)
        self._ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        self._wanted = threading.Semaphore(1)  # released as a part is taken: the next one is read then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="cosyclone-parts", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while self._wait_wanted():
                item = next(self._it, None)
                if item is None:
                    self._put(("end", None))
                    return
                self._put(("part", item))
        except BaseException as exc:  # handed to the reader of the parts, raised there
            self._put(("error", exc))

    def _wait_wanted(self) -> bool:
        """Wait until the part before is taken (one part ahead, no more); False once stopped."""
        while not self._stop.is_set():
            if self._wanted.acquire(timeout=0.1):
                return not self._stop.is_set()
        return False

    def _put(self, item: tuple[str, Any]) -> None:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> tuple[Manifest, Prepared] | None:
        """The next part (waiting for it if it is still being read); None after the last."""
        if self._stop.is_set():
            return None
        kind, value = self._ready.get()
        if kind == "error":
            self._stop.set()
            raise value
        if kind == "end":
            self._stop.set()
            return None
        self._wanted.release()
        return cast(tuple[Manifest, Prepared], value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        _close_iter(self._it)


def _close_iter(it: Iterator[object]) -> None:
    """Close a generator left part-way (its finally blocks run now, not when it is collected)."""
    close = getattr(it, "close", None)
    if close is not None:
        close()
