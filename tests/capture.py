"""Tests' way to run the CUDA-graph logic on CPU: the process captures with another backend.

The product captures a step through ``PROCESS.capture`` (CUDA graphs on the model's device); these
helpers swap in an :class:`~cosyclone.talker.graphs.EagerCapture` (or one that refuses), which makes
every device capture-capable, and put the process back as it was afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cosyclone.talker import graph_pool
from cosyclone.talker.graphs import CaptureBackend
from cosyclone.talker.session import TalkerSession


@contextlib.contextmanager
def captured_with(backend: CaptureBackend | None = None, *,
                  factory: Callable[[], CaptureBackend] | None = None) -> Iterator[None]:
    """Within: sessions asked for graphs capture through ``backend`` (that one instance) or a new
    ``factory()`` per set of graphs, on any device. Neither: the process as it is (CUDA graphs only
    on a GPU)."""
    process = graph_pool.PROCESS
    old = process.capture, process.capture_anywhere
    make = factory if factory is not None else (None if backend is None else (lambda: backend))
    if make is not None:
        process.capture, process.capture_anywhere = (lambda device: make()), True
    try:
        yield
    finally:
        process.capture, process.capture_anywhere = old


@contextlib.contextmanager
def graph_reports() -> Iterator[list[tuple[Any, int]]]:
    """Within: every session that closes appends what its graphs did (choice, graphs captured)."""
    seen: list[tuple[Any, int]] = []
    real = TalkerSession.close

    def close(self: TalkerSession) -> None:
        real(self)
        assert self.graphs_ended is not None
        seen.append(self.graphs_ended)

    TalkerSession.close = close  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        TalkerSession.close = real  # type: ignore[method-assign]
