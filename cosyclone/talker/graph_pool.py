"""CUDA graphs captured once per process: pooled decode steps that every talker session reuses.

Why: a captured graph refers to the buffers it was captured on (KV cache, slot state, sampler
state), so a session that builds its own step must capture again; the static schedule opens a
session per batch and isolation retries open more, so a run captured the same step shapes over
and over, each capture a stall. Here the step (with its buffers and its graphs) belongs to the
process: a session borrows an idle pooled step of its shape (talker, slot count, sampler
options), resets its slot state in place (the addresses the graphs read stay),
and gives it back when it closes; the next session of that shape replays the graphs already
captured. One capture per (slots, slot bucket, ``kv_len`` bucket) per process, as long as the step's cache
needs no growth (the engine reserves the cache a slot is sized for up front on a GPU).

A failed capture turns graphs off for the process (:meth:`ProcessGraphs.disable`): torch 2.11's
caching allocator can stay in capture mode after a capture raised (fixed upstream in 2.12), so
nothing may capture again, and nothing may call ``torch.cuda.empty_cache()`` (the OOM recovery:
:func:`free_device_cache` asks first). The reason is kept (:attr:`ProcessGraphs.disabled`) so every
path (static, continuous, isolation retries) records it.

The pool holds no session: a session's graphs are keyed on its step's shape
(:meth:`SlotStep.shape_key`: the slot bucket and ``kv_len`` the runner passes), not on a closure over
the session, so a closed (or dropped) session frees what it owned at once, and an idle pooled step
is dropped after :data:`MAX_IDLE` others (or by :func:`free_device_cache`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from cosyclone.base.capture_guard import CAPTURE_GUARD
from cosyclone.talker.graphs import CaptureBackend, CudaGraphCapture, GraphedStep
from cosyclone.talker.step import SlotStep

log = logging.getLogger(__name__)

#: Idle pooled steps kept per talker beyond those in use (each holds its KV cache).
MAX_IDLE = 2


@dataclass
class GraphCounts:
    """What the process's graphs did (counted by every pooled step's :class:`GraphedStep`)."""

    captures: int = 0  # graphs captured (one per step shape met)
    replays: int = 0  # decode steps that ran as a replay
    sessions: int = 0  # talker sessions that decoded through a pooled step
    reused: int = 0  # of those, sessions whose step and graphs an earlier session made


class PooledStep:
    """A slot step kept by the process, and the graphs captured on its buffers."""

    def __init__(self, step: SlotStep, key: Hashable, backend: Callable[[], CaptureBackend],
                 owner: ProcessGraphs) -> None:
        self.step = step
        self.key = key
        self.in_use = False
        self.used_before = False  # a session already ran on it (its graphs, if any, are reused)
        self._backend = backend
        self._owner = owner
        self.graphed = self._wrap(None)

    def _wrap(self, reason: str | None) -> GraphedStep:
        graphed = GraphedStep(
            self.step.step,
            backend=self._backend(),
            counts=self._owner.counts,
            on_failure=self._owner.disable,
        )
        graphed.reason = reason  # a capture that failed once stays off
        return graphed

    def regraph(self) -> GraphedStep:
        """After the step's buffers were reallocated (a cache growth): new graphs from now on."""
        self.graphed = self._wrap(self.graphed.reason)
        return self.graphed

    def reset(self) -> None:
        """A fresh session's start, in place: no slot running, every slot length 0 (buffers keep
        their addresses; stale cache cells are hidden by the lengths, as in any reused slot)."""
        for buf in (*self.step.state.buffers(), self.step.cache.get_buffer("lengths")):
            buf.zero_()


class ProcessGraphs:
    """The process's pooled steps (per talker model), its graph counts, and whether graphs are off."""

    def __init__(self) -> None:
        self.disabled: str | None = None  # why graphs are off for the rest of the process
        self.counts = GraphCounts()
        # how this process captures a step's graphs: CUDA graphs on the model's device. Another
        # CaptureBackend (graphs.EagerCapture) makes every device capture-capable, which is how the
        # capture and replay logic runs on CPU, the backend being the one part that differs
        self.capture: Callable[[torch.device], CaptureBackend] = CudaGraphCapture
        self.capture_anywhere = False  # True: graphs are tried on any device (with a non-CUDA capture)
        self._pools: weakref.WeakKeyDictionary[nn.Module, list[PooledStep]] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()

    def acquire(
        self,
        model: nn.Module,
        key: Hashable,
        build: Callable[[int, int], SlotStep],
        *,
        capacity: int,
        token_capacity: int,
    ) -> PooledStep:
        """An idle pooled step of ``key`` for ``model`` (the roomiest, grown when short), else a new
        one ``build(capacity, token_capacity)`` makes, capturing with :attr:`capture`."""
        with self._lock:
            pool = self._pools.setdefault(model, [])
            idle = [e for e in pool if e.key == key and not e.in_use]
            entry = max(idle, key=lambda e: e.step.capacity, default=None)
            if entry is None:
                entry = PooledStep(build(capacity, token_capacity), key, self._factory(model), self)
                pool.append(entry)
            else:
                pool.remove(entry)  # most recently used last
                pool.append(entry)
                entry.reset()
                if entry.step.grow(capacity, token_capacity):
                    entry.regraph()
            entry.in_use = True
            self.counts.sessions += 1
            self.counts.reused += entry.used_before
            entry.used_before = True
            return entry

    def _factory(self, model: nn.Module) -> Callable[[], CaptureBackend]:
        device, capture = next(model.parameters()).device, self.capture
        return lambda: capture(device)

    def release(self, entry: PooledStep) -> None:
        """A session is done with ``entry``: it goes idle (the oldest idle steps beyond :data:`MAX_IDLE`
        go)."""
        with self._lock:
            entry.in_use = False
            for pool in self._pools.values():
                if entry in pool:
                    if self.disabled is not None:  # graphs are off: nothing will reuse it
                        pool.remove(entry)
                        continue
                    idle = [e for e in pool if not e.in_use]
                    for old in idle[:max(0, len(idle) - MAX_IDLE)]:
                        pool.remove(old)

    def drop_idle(self) -> int:
        """Forget every idle pooled step (their caches and graphs go with the last reference)."""
        with self._lock:
            dropped = 0
            for pool in self._pools.values():
                idle = [e for e in pool if not e.in_use]
                dropped += len(idle)
                for e in idle:
                    pool.remove(e)
            return dropped

    def disable(self, reason: str) -> None:
        """A capture failed: no graphs in this process from now on (the first reason is kept), and
        no ``empty_cache`` (the allocator may still be capturing). Idle steps are forgotten."""
        with self._lock:
            if self.disabled is None:
                self.disabled = reason
                log.warning("CUDA graphs off for this process: %s", reason)
            self.drop_idle()

    def may_empty_cache(self) -> bool:
        """False once a capture failed (see the module docstring)."""
        return self.disabled is None

    def snapshot(self) -> dict[str, Any]:
        """The counts and the reason, as a run records them."""
        return {**asdict(self.counts), "disabled": self.disabled}

    def reset(self) -> None:
        """Back to a fresh process's state (tests: each test starts with graphs allowed, no pool)."""
        with self._lock:
            self.disabled = None
            self.counts = GraphCounts()
            self._pools = weakref.WeakKeyDictionary()


#: This process's graphs.
PROCESS = ProcessGraphs()


def free_device_cache(device: torch.device | str) -> bool:
    """After an out-of-memory error: forget idle pooled steps and, unless a capture failed in this
    process, return the caching allocator's free blocks (``torch.cuda.empty_cache``). Returns
    whether ``empty_cache`` ran. Every OOM recovery must call this, never ``empty_cache`` itself.

    It waits while a capture is under way or waiting (:data:`CAPTURE_GUARD`: torch refuses a free
    during a capture with an assert that would end the run), and it never raises: it runs in
    recovery paths, where a second error would turn one failed row into a failed run."""
    try:
        with CAPTURE_GUARD.device_work():
            PROCESS.drop_idle()
            if torch.device(device).type != "cuda" or not PROCESS.may_empty_cache():
                return False
            torch.cuda.empty_cache()
            return True
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    log.warning("freeing the device cache failed (%s); the run goes on without it", reason)
    return False
