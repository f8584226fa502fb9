"""Texts normalized on every core: a process pool whose workers build the normalizer once each.

wetext is pure CPU work under the GIL (about 30 us per character), so threads do not help and
processes do. A worker builds its :class:`~cosyclone.frontend.normalize.TextNormalizer` once (some
seconds: the grammars load) and then normalizes batches of texts. When this process has one thread
only, workers are forked and inherit its already built normalizer; otherwise (a loaded model with its
prefetch or writer threads, where forking is unsafe) they are spawned and build their own.

A text whose normalization raises in a worker comes back as missing: the caller normalizes it in
its own process, where the exception is raised exactly as it would have been without the pool (a
row's error names its manifest line, not a worker). A pool that breaks (a worker killed, a
normalizer that does not load there) is given up and the work is done in this process. The result
of a text does not depend on which process normalized it (:func:`normalize_serial` is the reference).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

BATCH_TEXTS = 128  # texts per task: about 0.4 s of wetext on short rows, small enough to balance two cores
MIN_POOL_TEXTS = 256  # fewer texts than this are normalized here (a pool costs a fork or seconds of loading)

Result = dict[str, tuple[str, str]]  # text -> (normalized text, lang)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def normalize_serial(normalizer: Any, texts: Sequence[str]) -> Result:
    """``texts`` normalized in this process (one ``_normalize`` each; the ones that raise are left out)."""
    out: Result = {}
    for text in texts:
        try:
            n = normalizer._normalize(text)
        except Exception:  # the caller's own pass raises it where the row's error is made
            continue
        out[text] = (n.text, n.lang)
    return out


def _work(kind: str, texts: Sequence[str]) -> Result:
    from cosyclone.frontend.normalize import get_normalizer

    return normalize_serial(get_normalizer(kind), texts)


def _warm(kind: str) -> None:
    from cosyclone.frontend.normalize import get_normalizer

    get_normalizer(kind)


class NormalizePool:
    """A lazily started pool of ``workers`` processes normalizing with a ``kind`` normalizer."""

    def __init__(self, kind: str, workers: int | None = None) -> None:
        self.kind = kind
        self.workers = max(1, workers if workers is not None else usable_cores())
        self._pool: cf.ProcessPoolExecutor | None = None
        self.broken = False

    def _start(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            method = "fork" if _single_threaded() and "fork" in multiprocessing.get_all_start_methods() else "spawn"
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(method),
                                                initializer=_warm, initargs=(self.kind,))
        return self._pool

    def submit(self, texts: Sequence[str]) -> list[cf.Future[Result]]:
        """Start normalizing ``texts`` in batches; [] when the pool is broken (the caller works alone)."""
        if self.broken or not texts:
            return []
        try:
            pool = self._start()
            return [pool.submit(_work, self.kind, list(texts[i:i + BATCH_TEXTS]))
                    for i in range(0, len(texts), BATCH_TEXTS)]
        except Exception:  # cannot start processes here (a sandbox, no /dev/shm): work alone
            self.broken = True
            return []

    def gather(self, futures: Sequence[cf.Future[Result]]) -> Result:
        """What ``futures`` gave; a batch lost to a broken pool is simply missing (and the pool given up)."""
        out: Result = {}
        for fut in futures:
            try:
                out.update(fut.result())
            except Exception:  # BrokenProcessPool, a worker that could not build its normalizer
                self.broken = True
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
