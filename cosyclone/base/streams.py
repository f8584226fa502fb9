"""The process's two side streams on a GPU: code2wav's and the talker's capture stream, drawn once.

Why once: ``torch.cuda.Stream()`` hands out streams from a small round-robin pool (32 per priority
on CUDA, about 3 on recent ROCm), so streams drawn anew per run and per regraph can wrap around
and coincide: code2wav's kernels would then queue behind the talker's warm-ups and captures (and a
capture would record on a stream another thread uses). Here each role draws its stream on first
use and keeps it for the life of the process, and a draw that wraps a stream another role (or the
device's default stream) already holds is drawn again, so the two are asserted distinct.

The stream maker is a parameter of :class:`ProcessStreams` so the rule (same object every call,
never the same underlying stream for two roles) is tested on a CPU with a stand-in pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, Protocol, cast

import torch

#: The roles that get a stream of their own.
StreamRole = Literal["code2wav", "capture"]

#: Draws a stream may take to find one no other role holds (a pool wraps around after its size).
MAX_DRAWS = 64


class StreamLike(Protocol):
    """What this module needs of a stream: the handle that says which device stream it wraps."""

    @property
    def cuda_stream(self) -> int: ...


def _cuda_stream(device: torch.device) -> StreamLike:
    return torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]


def _default_handle(device: torch.device) -> int | None:
    """The handle of the device's default stream (a side stream must never be it); None off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.default_stream(device).cuda_stream)


class ProcessStreams:
    """One stream per (role, device), the same object on every call, distinct between roles."""

    def __init__(self, make: Callable[[torch.device], StreamLike] = _cuda_stream,
                 default: Callable[[torch.device], int | None] = _default_handle) -> None:
        self._make = make
        self._default = default
        self._streams: dict[tuple[StreamRole, torch.device], StreamLike] = {}
        self._lock = threading.Lock()

    def get(self, role: StreamRole, device: torch.device | str) -> StreamLike:
        """The ``role``'s stream on ``device``: drawn on the first call, the same object after."""
        dev = torch.device(device)
        with self._lock:
            stream = self._streams.get((role, dev))
            if stream is None:
                stream = self._streams[(role, dev)] = self._draw(dev)
            return stream

    def _draw(self, device: torch.device) -> StreamLike:
        taken = {int(s.cuda_stream) for (_, d), s in self._streams.items() if d == device}
        default = self._default(device)
        if default is not None:
            taken.add(default)
        for _ in range(MAX_DRAWS):
            stream = self._make(device)
            if int(stream.cuda_stream) not in taken:
                return stream
        raise RuntimeError(f"no stream on {device} distinct from the {len(taken)} already in use "
                           f"after {MAX_DRAWS} draws")

    def assert_distinct(self) -> None:
        """Every role's stream on a device wraps a different device stream (an internal invariant)."""
        with self._lock:
            seen: dict[tuple[torch.device, int], StreamRole] = {}
            for (role, dev), s in self._streams.items():
                other = seen.setdefault((dev, int(s.cuda_stream)), role)
                assert other == role, f"the {role} and {other} streams on {dev} coincide"


#: This process's streams.
PROCESS_STREAMS = ProcessStreams()


def code2wav_stream(device: torch.device | str) -> torch.cuda.Stream:
    """The process's code2wav stream on a CUDA/ROCm ``device`` (its kernels overlap the talker's)."""
    stream = PROCESS_STREAMS.get("code2wav", device)
    PROCESS_STREAMS.assert_distinct()
    return cast(torch.cuda.Stream, stream)


def capture_stream(device: torch.device | str) -> torch.cuda.Stream:
    """The process's stream for the decode step's graph warm-ups and captures on ``device``."""
    stream = PROCESS_STREAMS.get("capture", device)
    PROCESS_STREAMS.assert_distinct()
    return cast(torch.cuda.Stream, stream)
