"""The frontend ahead of the talker: batches prepared one ahead, prompts many rows ahead.

Why two levels: a batch's frontend is cheap text work (normalization, tokenizer; serialized, the
tokenizer is not thread-safe) around the prompt's features (decode, resample, mels, the ONNX speech
tokenizer and CAM++: 0.5-2 s per distinct prompt on one core, the dominant cost when each row
brings its own prompt). One thread preparing the next batch whole could not keep a GPU's talker
fed, so the prompt features of the rows ahead run on :class:`PromptAhead`'s workers (each with its
own torch thread count: ``--frontend-threads``; ONNX sessions take the same count), each distinct
prompt once, while :class:`FrontendPrefetch` prepares the next batch, whose rows then find their
prompts ready. The same features as computed inline (float64 features, so thread counts do not
move them), hence the same records and bytes with or without either.

Must not: decide what a row's features are (``Frontend.prompt_features`` does) or record anything
(``stages.prepare_batch`` turns a row's frontend into its outcome).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from cosyclone.engine.stages import PreparedBatch
from cosyclone.manifest import ManifestRow


def _prompt_key(audio: Any) -> Hashable:
    """What makes two rows' prompts the same job: the path (the prompt cache also matches equal
    content under other names), or the in-memory wave object itself."""
    return ("id", id(audio)) if isinstance(audio, tuple) else ("path", str(audio))


@dataclass
class _Job:
    future: Future[tuple[Any, float]]
    rows_left: int  # rows still to take it; the job is forgotten at 0
    seconds_taken: bool = False  # the first taker's row is charged the compute time


class PromptAhead:
    """Prompt features of the rows ahead of the talker, on ``workers`` threads, each prompt once.

    :meth:`keep_ahead` (called as batch k is taken) submits the prompts of the next rows up to
    ``ahead_rows``; :meth:`take` hands a row its prompt's features (waiting for them if they are
    still being computed) and the seconds they cost (charged to the first row that takes them).
    A prompt that failed in a worker gives None: the row computes it inline and fails with its own
    message. Rows not submitted ahead (a row retried alone) give None as well.
    """

    def __init__(self, frontend: Any, batches: Sequence[Sequence[ManifestRow]], *, workers: int, threads: int,
                 ahead_rows: int, on_seconds: Callable[[float], None] | None = None) -> None:
        """``batches``: the run's batches, a list that may grow as parts arrive; ``on_seconds``: told
        each prompt's compute seconds (the run's stage accounting)."""
        self.frontend = frontend
        self.on_seconds = on_seconds
        self.batches = batches
        self.ahead_rows = max(1, ahead_rows)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="cosyclone-prompt",
                                       initializer=torch.set_num_threads, initargs=(max(1, threads),))
        self.jobs: dict[Hashable, _Job] = {}
        self.lock = threading.Lock()
        self.submitted = 0  # rows (in batch order) whose prompts were submitted
        self.submitted_batches = 0
        self.counted = 0  # batches whose rows ``past`` holds (counted once each, not summed again per batch)
        self.past = 0  # rows of batches 0 .. counted - 1
        self.computed = 0  # distinct prompt jobs run (a prompt repeated across rows counts once)

    @staticmethod
    def usable(frontend: Any) -> bool:
        """Whether ``frontend`` computes prompt features apart (the real one does; stand-ins may not)."""
        return callable(getattr(frontend, "prompt_features", None))

    def keep_ahead(self, k: int) -> None:
        """Batch ``k`` is being prepared: submit the prompts of the batches after it until
        ``ahead_rows`` rows past batch ``k`` are covered."""
        while self.counted <= k:
            self.past += len(self.batches[self.counted])
            self.counted += 1
        past = self.past
        while self.submitted_batches < len(self.batches) and (self.submitted_batches <= k
                                                             or self.submitted < past + self.ahead_rows):
            for row in self.batches[self.submitted_batches]:
                self._submit(row)
            self.submitted_batches += 1

    def _submit(self, row: ManifestRow) -> None:
        key = _prompt_key(row.prompt_audio)
        with self.lock:
            self.submitted += 1
            job = self.jobs.get(key)
            if job is not None:
                job.rows_left += 1
                return
            self.computed += 1
            self.jobs[key] = _Job(self.pool.submit(self._compute, row.prompt_audio, row.id), rows_left=1)

    def _compute(self, audio: Any, row_id: str) -> tuple[Any, float]:
        t0 = time.perf_counter()
        with torch.inference_mode():
            feats = self.frontend.prompt_features(audio, row_id=row_id)
        seconds = time.perf_counter() - t0
        if self.on_seconds is not None:
            self.on_seconds(seconds)
        return feats, seconds

    def take(self, row: ManifestRow) -> tuple[Any, float]:
        """(``row``'s prompt features or None, seconds to charge to the row)."""
        key = _prompt_key(row.prompt_audio)
        with self.lock:
            job = self.jobs.get(key)
            if job is None:
                return None, 0.0
            job.rows_left -= 1
            if job.rows_left <= 0:
                del self.jobs[key]
            first = not job.seconds_taken
            job.seconds_taken = True
        try:
            feats, seconds = job.future.result()
        except Exception:  # the row computes it again inline, and fails with its own message
            return None, 0.0
        return type(feats)({k: v.clone() for k, v in feats.items()}), seconds if first else 0.0

    def close(self) -> None:
        for job in self.jobs.values():
            job.future.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)


class FrontendPrefetch:
    """The frontend ``depth`` batches ahead on a worker thread, over a list of batches that grows as
    the run's parts arrive. :meth:`ready` says whether batch k is prepared (the scheduler admits only
    those while the talker has work); :meth:`take` hands it over (waiting for it when the talker has
    nothing else to do) and keeps the next ones submitted (and the prompt workers, when there are
    any, ``ahead_rows`` rows ahead of them)."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        prepare: Callable[[Sequence[ManifestRow]], PreparedBatch],
        batches: Sequence[Sequence[ManifestRow]],
        *,
        enabled: bool,
        prompts: PromptAhead | None = None,
        depth: int = 2,
    ) -> None:
        self.pool, self.prepare, self.batches, self.enabled = pool, prepare, batches, enabled
        self.prompts = prompts
        self.depth = max(1, depth)
        self.ahead: dict[int, Future[PreparedBatch]] = {}
        self.taken = 0  # batches handed over (the next to take)

    def fill(self) -> None:
        """Keep the ``depth`` batches after the last one taken submitted (call when batches arrive)."""
        if not self.enabled:
            return
        for k in range(self.taken, min(len(self.batches), self.taken + self.depth)):
            if k not in self.ahead:
                if self.prompts is not None:
                    self.prompts.keep_ahead(k)
                self.ahead[k] = self.pool.submit(self.prepare, self.batches[k])

    def ready(self, k: int) -> bool:
        """Whether taking batch ``k`` now would not wait (prepared, failed, or no prefetch: prepared
        inline)."""
        ahead = self.ahead.get(k)
        return ahead is None or ahead.done()

    def take(self, k: int) -> PreparedBatch | None:
        """Batch ``k``'s frontend output if it was prepared ahead (None: prepare it on this thread)."""
        prepared = _result_or_none(self.ahead.pop(k, None))
        self.taken = max(self.taken, k + 1)
        self.fill()
        return prepared

    def cancel(self) -> None:
        for ahead in self.ahead.values():
            ahead.cancel()
        self.ahead.clear()
        if self.prompts is not None:
            self.prompts.close()


def _result_or_none(ahead: Future[PreparedBatch] | None) -> PreparedBatch | None:
    """The prefetched batch, or None (no prefetch, or it raised: the caller prepares it again)."""
    if ahead is None:
        return None
    try:
        return ahead.result()
    except Exception:
        return None
