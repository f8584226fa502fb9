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
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from cosyclone.engine import stages as S
from cosyclone.engine.stages import PreparedBatch, Stages
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions


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
                 ahead_rows: int) -> None:
        self.frontend = frontend
        self.batches = batches
        self.ahead_rows = max(1, ahead_rows)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="cosyclone-prompt",
                                       initializer=torch.set_num_threads, initargs=(max(1, threads),))
        self.jobs: dict[Hashable, _Job] = {}
        self.lock = threading.Lock()
        self.submitted = 0  # rows (in batch order) whose prompts were submitted
        self.submitted_batches = 0
        self.computed = 0  # distinct prompt jobs run (a prompt repeated across rows counts once)

    @staticmethod
    def usable(frontend: Any) -> bool:
        """Whether ``frontend`` computes prompt features apart (the real one does; stand-ins may not)."""
        return callable(getattr(frontend, "prompt_features", None))

    def keep_ahead(self, k: int) -> None:
        """Batch ``k`` is being prepared: submit the prompts of the batches after it until
        ``ahead_rows`` rows past batch ``k`` are covered."""
        past = sum(len(b) for b in self.batches[:k + 1])
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
        return feats, time.perf_counter() - t0

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
    """The frontend one batch ahead on a worker thread: :meth:`take` of batch k starts batch k + 1
    (and keeps the prompt workers, when there are any, ``ahead_rows`` rows ahead of it)."""

    def __init__(self, pool: ThreadPoolExecutor, stages: Stages, batches: Sequence[Sequence[ManifestRow]],
                 opts: RunOptions, *, enabled: bool, prompts: PromptAhead | None = None) -> None:
        self.pool, self.stages, self.batches, self.opts, self.enabled = pool, stages, batches, opts, enabled
        self.prompts = prompts
        self.ahead: tuple[int, Future[PreparedBatch]] | None = None
        if enabled and batches:
            self.ahead = (0, self._submit(0))

    def _submit(self, k: int) -> Future[PreparedBatch]:
        if self.prompts is None:
            return self.pool.submit(S.prepare_batch, self.stages, self.batches[k], self.opts)
        self.prompts.keep_ahead(k)
        return self.pool.submit(S.prepare_batch, self.stages, self.batches[k], self.opts, prompts=self.prompts)

    def take(self, k: int) -> PreparedBatch | None:
        """Batch ``k``'s frontend output if it was prepared ahead (None: prepare it on this thread)."""
        prepared = None
        if self.ahead is not None and self.ahead[0] == k:
            prepared = _result_or_none(self.ahead[1])
            self.ahead = None
        if self.enabled and k + 1 < len(self.batches):
            self.ahead = (k + 1, self._submit(k + 1))
        return prepared

    def cancel(self) -> None:
        if self.ahead is not None:
            self.ahead[1].cancel()
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
