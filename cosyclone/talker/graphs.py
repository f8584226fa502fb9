"""CUDA graphs for the decode step: capture once per step shape, replay every step.

Why: on a GPU the talker's speed is set by host work per step (hundreds of kernel launches at
batch 16), not by the weights. The engine's step already has fixed shapes and needs no host
value (:mod:`cosyclone.talker.step`), so its launches can be recorded once as a CUDA graph and
replayed with one call. A step's shape depends on the slot count (fixed for one
:func:`~cosyclone.talker.decode.generate` call, so one engine is one slot-count bucket) and on the
KV cells it reads (the scheduler's ``kv_len`` bucket, a host int baked into the kernels): one
graph per ``kv_len`` key, captured when that key is first met, all sharing one memory pool (they
never run concurrently, and the engine's step returns nothing that outlives a replay).

Why no state snapshot around warm-up: capture records kernels without running them, so the
wrapper's first calls for a key run the step for real (they are the warm-up, on a side stream on
CUDA), the next call captures and then replays once, and later calls only replay. Every decode
step is therefore executed exactly once, eagerly or by replay, and the tokens cannot depend on
when capture happened.

The static buffers: the engine's state, KV cache and sampler state are registered buffers that
keep their addresses for the whole decode (``kv_cache.py``), so the engine's step has no inputs
or outputs to copy. :class:`GraphedStep` also serves callables that do take tensors: its static
input buffers (one set per key, cloned from the first call's arguments) receive each call's
arguments by ``copy_`` and it returns the graph's static outputs, valid until the next call.

The capture mechanism is a :class:`CaptureBackend`: :class:`CudaGraphCapture` (``torch.cuda``)
on a GPU, :class:`EagerCapture` (the same state machine and buffer copies, no graph) so the
wrapper's logic is tested on CPU. A capture runs under the process's capture guard
(:mod:`cosyclone.base.capture_guard`: code2wav paused, no cache free meanwhile). A capture that
raises switches the wrapper to eager for the rest of the decode (the eager step runs after the
handler), with the reason recorded (:attr:`GraphedStep.reason`), and tells its owner
(``on_failure``: the process's graphs go off for good, :mod:`cosyclone.talker.graph_pool`); what
really ran is counted (:attr:`GraphedStep.replayed`; per row ``graph_steps`` in the sampler
diagnostics, per session ``StepRunner.graphs_used`` / ``TalkerSession.graph_capture_error``). Graphs are
captured once per process and step shape: the pooled steps of :mod:`~cosyclone.talker.graph_pool`
outlive the sessions that use them.

UNVERIFIED on a GPU: this module was written and tested on a CPU-only machine; the CUDA path
(side-stream warm-up, ``torch.cuda.graph`` capture with a shared pool, replay) follows torch's
documented protocol but has not been run. ``tests/talker/test_cuda_graphs.py`` holds the ``gpu``-marked
checks (graph tokens equal eager tokens) that ``make test-gpu`` / ``benchmarks/gpu_check.sh`` run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import torch
from torch import Tensor

from cosyclone.base.capture_guard import CAPTURE_GUARD
from cosyclone.base.streams import capture_stream
from cosyclone.options import CudaGraphs

log = logging.getLogger(__name__)

#: Values of ``--cuda-graphs`` / ``DecodeOptions.cuda_graphs``: the run option's vocabulary.
GRAPH_MODES: tuple[str, ...] = get_args(CudaGraphs)


@dataclass(frozen=True)
class GraphChoice:
    """Whether the decode step is captured, and why (or why not)."""

    enabled: bool
    reason: str

    @property
    def value(self) -> Literal["on", "off"]:
        """``on`` | ``off``: what a run records (``summary.json`` options ``cuda_graphs``)."""
        return "on" if self.enabled else "off"


def resolve_cuda_graphs(requested: str, device: torch.device | str, *, draw: str = "race",
                        compile: str | None = None, anywhere: bool = False) -> GraphChoice:
    """``auto`` or ``on`` (a resolved run's word for the same choice): capture when the device is CUDA/ROCm
    (or ``anywhere``: the process captures with a backend that needs no GPU) and the step can be captured: the
    race draw (the LEGACY multinomial draw reads the host every step), and not the ``torch.compile`` path (one
    or the other). ``off``: never."""
    if requested not in GRAPH_MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(GRAPH_MODES)}, not {requested!r}")
    if requested == "off":
        return GraphChoice(False, "off requested")
    dev = torch.device(device)
    if not anywhere and (dev.type != "cuda" or not torch.cuda.is_available()):
        return GraphChoice(False, f"device is {dev.type}: CUDA graphs need a CUDA/ROCm device")
    if draw == "legacy-multinomial":
        return GraphChoice(False, "the legacy-multinomial draw reads the host every step")
    if compile:
        return GraphChoice(False, f"the torch.compile path ({compile}) is used instead")
    return GraphChoice(True, f"auto on {dev.type}")


class CaptureBackend(Protocol):
    """How :class:`GraphedStep` warms up and captures a no-argument thunk."""

    def warmup(self, thunk: Callable[[], Any]) -> Any:
        """Run ``thunk`` for real (a real decode step) and return its result."""
        ...

    def capture(self, thunk: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        """Record ``thunk`` WITHOUT running it; return (replay, the recorded outputs)."""
        ...


class EagerCapture:
    """No graph: "capture" keeps the thunk and its outputs' buffers, "replay" runs it again.

    What :class:`GraphedStep` does around a capture (warm-up count per key, static inputs,
    replay after capture, fallback) is the same as with CUDA, so CPU tests cover it. The
    outputs of one call are copied into buffers kept from the first run, like a graph's
    fixed output addresses.
    """

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def warmup(self, thunk: Callable[[], Any]) -> Any:
        return thunk()

    def capture(self, thunk: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        self.captures += 1
        holder: dict[str, Any] = {}

        def replay() -> None:
            self.replays += 1
            out = thunk()
            if "out" not in holder:
                holder["out"] = out
            else:
                _copy_into(holder["out"], out)

        return replay, holder


class CudaGraphCapture:
    """``torch.cuda.CUDAGraph`` capture: the process's capture stream for every warm-up and capture
    (:func:`~cosyclone.base.streams.capture_stream`: drawn once, never code2wav's), one memory pool
    for all the graphs of its owner (a pooled decode step).

    Why not ``torch.cuda.graph``: its ``__enter__`` synchronizes the whole device and empties the
    device and pinned-host caches (and may ``gc.collect``) before every capture; a step is captured
    once per ``kv_len`` bucket in the middle of a run whose allocator should stay warm, and a device
    synchronize would wait for code2wav's stream too. Here a capture waits only on its own stream:
    the side stream waits (on the device, by event) for the talker's current stream, captures, and
    the current stream waits for it; nothing is synchronized on the host (a capture runs no
    kernel, so it needs no finished input). ``capture_end`` runs even when the step raised.
    ``capture_error_mode="thread_local"``: other threads of the run (prompt workers, code2wav on
    its own stream) may use CUDA while this one captures. UNVERIFIED on a GPU (module docstring).
    """

    def __init__(self, device: torch.device | str, stream: torch.cuda.Stream | None = None) -> None:
        """``stream``: where warm-ups and captures run; None: the process's capture stream."""
        self.device = torch.device(device)
        self.pool: Any = None
        self.graphs: list[Any] = []  # keep every graph alive for the decode
        self.stream = capture_stream(self.device) if stream is None else stream

    def _on_side(self, run: Callable[[], Any]) -> Any:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                return run()
        finally:
            current.wait_stream(self.stream)

    def warmup(self, thunk: Callable[[], Any]) -> Any:
        return self._on_side(thunk)

    def capture(self, thunk: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        graph = torch.cuda.CUDAGraph()

        def record() -> Any:
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                out = thunk()
            except BaseException:
                with contextlib.suppress(Exception):  # end the broken capture; report the step's error
                    graph.capture_end()
                raise
            graph.capture_end()
            return out

        out = self._on_side(record)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs.append(graph)
        return graph.replay, {"out": out}


def _copy_into(dst: Any, src: Any) -> None:
    """Copy ``src`` (a tensor, a sequence of them, or None) into the same-shaped ``dst``."""
    if isinstance(dst, Tensor):
        dst.copy_(src)
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src, strict=True):
            _copy_into(d, s)
    elif dst is not None or src is not None:
        raise TypeError(
            f"graph outputs must be tensors, sequences of tensors or None, not {type(src).__name__}"
        )


class GraphedStep:
    """Call ``fn(key, *tensors)`` through per-key captured graphs with static input/output buffers.

    ``key``, passed with each call, names the step shape (the step's slot bucket and ``kv_len``,
    :meth:`~cosyclone.talker.step.SlotStep.shape_key`). For each key the first
    ``warmup`` calls run ``fn`` for real on the key's static inputs, the next one captures and
    replays, the rest replay. The returned outputs are the graph's static buffers: read or copy
    them before the next call. After a failed capture every call runs ``fn`` eagerly on its own
    arguments and :attr:`reason` says why.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        backend: CaptureBackend,
        *,
        warmup: int = 2,
        counts: Any = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """``counts``: an object whose ``captures``/``replays`` this wrapper adds to (the process's
        :class:`~cosyclone.talker.graph_pool.GraphCounts`); ``on_failure``: told the reason once a
        capture failed (the process turns graphs off)."""
        self.fn = fn
        self.backend = backend
        self.counts = counts
        self.on_failure = on_failure
        self.warmup = max(1, int(warmup))  # at least one real run: lazy inits must not happen in capture
        self.inputs: dict[Hashable, tuple[Tensor, ...]] = {}
        self.replays: dict[Hashable, tuple[Callable[[], None], dict[str, Any]]] = {}
        self.calls: dict[Hashable, int] = {}
        self.reason: str | None = None  # set when capture failed: the decode went on eagerly
        self.replayed = 0  # calls that ran as a replay
        self.last_replayed = False  # whether the last call did

    @property
    def captured(self) -> int:
        """Graphs captured so far."""
        return len(self.replays)

    def _static(self, key: Hashable, args: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The key's static input buffers, holding ``args`` (allocated on the key's first call)."""
        bufs = self.inputs.get(key)
        if bufs is None:
            bufs = self.inputs[key] = tuple(a.detach().clone() for a in args)
        else:
            for b, a in zip(bufs, args, strict=True):
                b.copy_(a)
        return bufs

    def _capture(self, key: Hashable, bufs: tuple[Tensor, ...]) -> tuple[Callable[[], None], Any] | None:
        """Capture ``key``'s step while no code2wav call and no cache free runs (the process's
        :data:`~cosyclone.base.capture_guard.CAPTURE_GUARD`); None when the capture failed (graphs go
        off, the reason kept). Nothing runs in the handler: only the reason leaves it."""
        try:
            with CAPTURE_GUARD.capturing():
                return self.backend.capture(lambda: self.fn(key, *bufs))
        except Exception as exc:
            self.reason = f"capture failed for key {key!r}: {type(exc).__name__}: {exc}"
        log.warning("CUDA graphs off for this decode: %s", self.reason)
        if self.on_failure is not None:
            self.on_failure(self.reason)
        return None

    def __call__(self, key: Hashable, *args: Tensor) -> Any:
        self.last_replayed = False
        if self.reason is not None:
            return self.fn(key, *args)
        bufs = self._static(key, args)
        done = self.replays.get(key)
        if done is None:
            n = self.calls.get(key, 0)
            self.calls[key] = n + 1
            if n < self.warmup:
                return self.backend.warmup(lambda: self.fn(key, *bufs))
            done = self._capture(key, bufs)
            if done is None:  # capture refused: decode on eagerly (capture ran nothing), outside the handler
                return self.fn(key, *args)
            self.replays[key] = done
            if self.counts is not None:
                self.counts.captures += 1
        replay, holder = done
        replay()
        self.replayed += 1
        if self.counts is not None:
            self.counts.replays += 1
        self.last_replayed = True
        return holder.get("out")
