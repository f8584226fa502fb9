"""The process's guard between CUDA graph captures and the device work that must not meet them.

Why: while a stream captures, torch refuses to empty its caching allocator (an internal assert that
is not an ordinary exception and ends the run), and code2wav's out-of-memory recovery frees the
cache from another thread at any time. So a capture runs only at a quiescent point: it waits for
code2wav's current call to end and holds new calls back until it is done (code2wav paused), and
no free runs while it captures. Captures take the guard alone (:meth:`CaptureGuard.capturing`);
code2wav's calls and every free share it (:meth:`CaptureGuard.device_work`). A thread may share
it again while it shares it (a free inside a code2wav call), and a capture waiting for the guard
keeps new sharers out, so a busy code2wav thread cannot starve it. Plain Python: the same guard
runs on a CPU with a stand-in capture, which is how it is tested.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class CaptureGuard:
    """Captures alone; code2wav's device work and cache frees together (module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sharing = 0  # device work and frees under way (all threads)
        self._capturing = False
        self._waiting = 0  # captures waiting for the guard
        self._mine = threading.local()  # this thread's depth of device_work()

    def _depth(self) -> int:
        depth: int = getattr(self._mine, "depth", 0)
        return depth

    @contextlib.contextmanager
    def device_work(self) -> Iterator[None]:
        """Within: no capture runs (a capture waiting or under way is waited for first)."""
        depth = self._depth()
        with self._cond:
            while not depth and (self._capturing or self._waiting):
                self._cond.wait()
            self._sharing += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            with self._cond:
                self._sharing -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Within: this thread captures alone (no device work, no free, no other capture).

        Raises RuntimeError when this thread itself is inside :meth:`device_work` (it would wait
        for itself); the caller treats that as a failed capture and steps eagerly."""
        if self._depth():
            raise RuntimeError("a capture was asked for inside device work on the same thread")
        with self._cond:
            self._waiting += 1
            try:
                while self._capturing or self._sharing:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()


#: This process's guard.
CAPTURE_GUARD = CaptureGuard()
