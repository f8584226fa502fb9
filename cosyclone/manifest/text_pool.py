"""Texts normalized on every core: a process pool whose workers build the normalizer once each.

wetext is pure CPU work under the GIL (about 30 us per character), so threads do not help and
processes do. Workers are forked, so each inherits this process's already built
:class:`~cosyclone.frontend.normalize.TextNormalizer` (building one loads the grammars: seconds) and
nothing is imported again. Forking is done only while this process runs no other Python thread (a
thread holding a lock at the fork would leave it held in the child); native threads such as the
one importing torch starts are idle and harmless. Otherwise, and where fork does not exist, the
texts are normalized in this process. (Spawned workers are not used: they would import the
caller's ``__main__`` again, which runs an unguarded script's own work a second time.)

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

from cosyclone.options import TextFrontendName

BATCH_TEXTS = 128  # texts per task: about 0.4 s of wetext on short rows, small enough to balance two cores
MIN_POOL_TEXTS = 256  # fewer texts than this are normalized here (a pool costs a fork or seconds of loading)

Result = dict[str, tuple[str, str]]  # text -> (normalized text, lang)


def usable_cores() -> int:
    """Worker processes to use: ``COSYCLONE_TEXT_WORKERS`` when set (1: normalize in this process only),
    else the cores this process may run on (its affinity mask where the OS has one)."""
    env = os.environ.get("COSYCLONE_TEXT_WORKERS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether worker processes may be forked now: fork exists and no other Python thread runs."""
    import threading

    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


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


def _work(kind: TextFrontendName, texts: Sequence[str]) -> Result:
    from cosyclone.frontend.normalize import get_normalizer

    return normalize_serial(get_normalizer(kind), texts)


class NormalizePool:
    """A lazily started pool of ``workers`` processes normalizing with a ``kind`` normalizer."""

    def __init__(self, kind: TextFrontendName, workers: int | None = None) -> None:
        self.kind = kind
        self.workers = max(1, workers if workers is not None else usable_cores())
        self._pool: cf.ProcessPoolExecutor | None = None
        self.broken = False

    def _start(self) -> cf.ProcessPoolExecutor | None:
        if self._pool is None:
            if not can_fork():
                self.broken = True
                return None
            from cosyclone.frontend.normalize import get_normalizer

            get_normalizer(self.kind)  # built here once: the forked workers inherit it
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._pool

    def submit(self, texts: Sequence[str]) -> list[cf.Future[Result]]:
        """Start normalizing ``texts`` in batches; [] when there is no pool (the caller works alone)."""
        if self.broken or not texts:
            return []
        try:
            pool = self._start()
            if pool is None:
                return []
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
