"""The model replica of ``--engine ray``: the code that runs inside Ray's worker processes.

Why a module of its own: the driver's pool (:mod:`cosyclone.ray.pool`) decides what runs where
and when; this is what each actor does with a task, and all it needs is here. :class:`SynthActor`
loads one :class:`~cosyclone.engine.Engine` and runs each task (consecutive planned batches) through
it under the run's ``--schedule`` and stage-0 token checkpoint, so there is no second pipeline; it
streams each row's :class:`~cosyclone.engine.RowResult` back as its batch finishes (a Ray streaming
generator), then a :class:`TaskEnd`. A stop request from the driver reaches the running task
through :meth:`SynthActor.stop` (its own concurrency group, so it runs while the task does): the
engine admits no further batch and ends once the batches in flight are done.

Prompts travel with the tasks: the driver reads each distinct prompt file once into Ray's object
store, a task carries references by path, and the frontend decodes the bytes (:class:`ShippedPrompts`,
:attr:`cosyclone.frontend.Frontend.prompt_bytes`); a worker node needs only the model directory.

Everything crossing process boundaries is plain data: rows as JSON (:func:`row_to_dict`), prompts
as bytes, results as :class:`RowResult` (with the wave as a float32 array).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosyclone.base.device import DevicePolicy
from cosyclone.base.stop import StopRequest
from cosyclone.engine import Engine, RowResult
from cosyclone.errors import CosycloneError
from cosyclone.folder.token_store import TokenStore
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import RunOptions

#: The actor's concurrency group for :meth:`SynthActor.stop`: a task runs in the default group (one
#: at a time), the stop in this one, so it reaches the task while it runs.
CONTROL = "control"


@dataclass(frozen=True)
class TaskEnd:
    """The last item of a task: what the driver counts besides the rows."""

    hits: int  # segments whose talker result came from the stage-0 checkpoint
    graph_errors: tuple[str, ...]  # why CUDA graph captures failed in this actor so far


@dataclass(frozen=True)
class LoadFailed:
    """The only item of a task on an actor whose model did not load (the driver stops as locally)."""

    message: str  # the loader's message (a bad model directory names the file)


def row_to_dict(row: ManifestRow) -> dict[str, Any]:
    """A manifest row as JSON-able data (the prompt path as a string)."""
    d = asdict(row)
    d["prompt_audio"] = str(row.prompt_audio)
    return d


def row_from_dict(d: dict[str, Any]) -> ManifestRow:
    return ManifestRow(**{**d, "prompt_audio": Path(d["prompt_audio"])})


def encode_task(batches: list[list[ManifestRow]], keys: Mapping[str, str]) -> str:
    """A task as it travels: its batches' rows and the stage-0 checkpoint keys of those rows."""
    return json.dumps(
        {
            "batches": [[row_to_dict(r) for r in b] for b in batches],
            "keys": {r.id: keys[r.id] for b in batches for r in b if r.id in keys},
        },
        ensure_ascii=False,
    )


class ShippedPrompts(Mapping[str, bytes]):
    """A task's prompt files by path, fetched from Ray's object store when the frontend reads one.

    Lazy, so an actor holds one prompt's bytes at a time (the frontend caches features by content,
    not bytes); the node's object store keeps the copy that every actor of the node shares."""

    def __init__(self, refs: Mapping[str, Any]) -> None:
        self.refs = dict(refs)

    def __getitem__(self, path: str) -> bytes:
        import ray

        return bytes(ray.get(self.refs[path]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __len__(self) -> int:
        return len(self.refs)


class SynthActor:
    """One model replica: stages loaded once, then one task of planned batches per :meth:`run` call."""

    def __init__(self, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, threads: int | None,
                 token_root: str | None = None) -> None:
        from cosyclone.base.device import apply_precision

        apply_precision()  # process-wide (no TF32): the driver's resolve() switched only the driver's process
        self.threads = threads
        self._threads()
        self.opts = opts
        self.token_root = token_root  # the run folder's stage-0 checkpoint (None: the run keeps none)
        self.stopped: str | None = None  # the signal the driver stopped the run for (no task runs after it)
        self._stop: StopRequest | None = None  # the running task's
        self.load_error: str | None = None
        try:
            self.engine: Engine | None = Engine.load(None, opts, cfg=cfg)
        except CosycloneError as exc:  # a bad model directory: told to the driver by the first task
            self.engine = None
            self.load_error = str(exc)  # (raised here, Ray would bury it in an ActorDiedError traceback)

    def _threads(self) -> None:
        """Explicit torch threads, not Ray's OMP_NUM_THREADS: CPU bytes depend on the count, and a task
        may run on another thread than ``__init__`` (torch's count is per thread)."""
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)

    def run(self, task: str, prompts: Mapping[str, Any]) -> Iterator[RowResult | TaskEnd | LoadFailed]:
        """One task (:func:`encode_task`): each row's result as its batch finishes, then a :class:`TaskEnd`.

        ``prompts``: object references of the task's prompt files by path (the driver's reads)."""
        if self.load_error is not None or self.engine is None:
            yield LoadFailed(self.load_error or "the model did not load")
            return
        self._threads()
        spec = json.loads(task)
        batches = [[row_from_dict(d) for d in b] for b in spec["batches"]]
        tokens = TokenStore(Path(self.token_root), spec["keys"]) if self.token_root else None
        stop = self._stop = StopRequest(grace=math.inf)  # the driver decides when in-flight rows are dropped
        if self.stopped is not None:  # the stop came before this task started
            stop.request(self.stopped)
        self.engine.stages.frontend.prompt_bytes = ShippedPrompts(prompts)
        # a loop, not ``yield from``: Ray sends values into its generators, which an engine's would refuse
        try:
            for result in self.engine.run(batches=batches, opts=self.opts, tokens=tokens, stop=stop):  # noqa: UP028
                yield result
        finally:
            self.engine.stages.frontend.prompt_bytes = {}
            self._stop = None
            if tokens is not None:
                tokens.close()  # its queued writes down before the task says it ended
        yield TaskEnd(
            hits=tokens.hits if tokens is not None else 0, graph_errors=tuple(self.engine.graph_errors)
        )

    def stop(self, signal_name: str) -> None:
        """The driver's stop request: the running task admits no further batch (runs in :data:`CONTROL`)."""
        self.stopped = signal_name
        running = self._stop
        if running is not None:
            running.request(signal_name)
