"""``--engine ray``: the local engine's batches, run by a pool of Ray actors, written by the driver.

Why our own pool rather than Ray Data: a run must stop on SIGTERM (admit nothing new, let the rows
in flight finish, then drop what is left and stop the actors), place each actor on the node the
plan gave it, ship the prompts with the tasks, and stream rows back while later parts are still
fed; Ray Data's ``map_batches`` hides its tasks and actors from all of that. Ray itself still does
the rest: a killed actor is restarted and its task re-run (``max_restarts`` / ``max_task_retries``
-1), results stream back as a task makes them (an actor method that is a generator).

The work is the local engine's batch plan, part by part, grouped into tasks of consecutive
batches (:func:`task_groups`), so a row is computed in exactly the batch it would be computed in
locally and its audio is byte-identical; :class:`~cosyclone.ray.actor.SynthActor` runs them.
The driver hands each row to the writer once: a task re-run after a kill can only repeat rows
already received, and those are dropped by id.

Resources: how many actors, with how many torch threads, on which node, and what each asks Ray
for (CPUs, GPUs, ``memory=`` its measured footprint) is :mod:`cosyclone.ray.plan`'s: the pool
plans on the live cluster's nodes after connecting and refuses a run that cannot fit before any
actor starts; each actor is pinned (softly: elsewhere if its node dies) to its planned node.
"""

from __future__ import annotations

import builtins
import math
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cosyclone.base.device import DevicePolicy
from cosyclone.base.stop import StopRequest
from cosyclone.engine import RowResult
from cosyclone.errors import CosycloneError
from cosyclone.folder.token_store import TokenStore
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import FolderOptions, RunOptions
from cosyclone.ray.actor import (
    CONTROL,
    LoadFailed,
    SynthActor,
    TaskEnd,
    encode_task,
    row_from_dict,
    row_to_dict,
)
from cosyclone.ray.cluster import init, read_cluster, require_ray
from cosyclone.ray.plan import RayPlan, plan_run

__all__ = ["ActorPool", "RaySource", "placement", "row_from_dict", "row_to_dict", "run_ray", "task_groups"]

#: Seconds the driver waits for a result before it looks at a stop request again.
POLL_SECONDS = 0.2


def task_groups(n_batches: int, actors: int, schedule: str) -> list[list[int]]:
    """Planned batches grouped into Ray tasks, in plan order (longest first).

    ``static``: one batch a task, as the local static schedule runs them. ``continuous``: about
    two tasks per actor of consecutive batches, so each actor's talker session carries rows across
    the batches of its task as the local continuous schedule does across the run, while a killed
    actor re-runs only its task and the pool still balances at the end.
    """
    if schedule == "static" or n_batches == 0:
        return [[k] for k in range(n_batches)]
    per = max(1, math.ceil(n_batches / max(1, 2 * actors)))
    return [list(range(k, min(n_batches, k + per))) for k in range(0, n_batches, per)]


def placement(plan: RayPlan) -> list[str]:
    """The node id of each actor, in the order they start: round robin over the plan's nodes, each up
    to the actors it has room for, so that a run of few tasks is spread over the nodes too."""
    order: list[str] = []
    for k in range(max((n.actors for n in plan.nodes), default=0)):
        order += [n.node_id for n in plan.nodes if n.actors > k]
    return order[:plan.actors]


@dataclass
class _Task:
    spec: str  # the encoded task (ray_actor.encode_task)
    prompts: dict[str, Any]  # its prompt files' object references, by path


class ActorPool:
    """The run's actors on a connected cluster: tasks queued, dispatched one per idle actor, results
    streamed back; a stop request stops admitting tasks, tells the running ones, and :meth:`kill` ends them.

    Actors start as tasks arrive (never more than the plan's, nor than the tasks fed), in the order of
    :func:`placement`. ``on_start`` hears of each actor's node as it starts (the run's record).
    """

    def __init__(self, ray: Any, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, plan: RayPlan,
                 tokens: TokenStore | None, stop: StopRequest | None,
                 on_start: Callable[[list[str]], None] | None = None) -> None:
        self.ray, self.plan, self.opts, self.tokens, self.stop = ray, plan, opts, tokens, stop
        self.on_start = on_start or (lambda nodes: None)
        self._actor_args = (
            cfg,
            policy,
            replace(opts, threads=plan.threads if plan.threads is not None else opts.threads),
            plan.threads,
            str(tokens.root) if tokens is not None else None,
        )
        self._remote = _actor_class(ray)
        self._where = placement(plan)
        self.actors: list[Any] = []  # handles, in start order (None: died for good)
        self.started: list[str] = []  # the node id each actor was placed on
        self._idle: deque[int] = deque()
        self._queue: deque[_Task] = deque()
        self._running: dict[Any, tuple[int, _Task]] = {}  # a task's result generator -> (actor, task)
        self._shipped: dict[str, Any] = {}  # prompt path -> object reference (None: unreadable here)
        self._tasks = 0
        self.fed: set[str] = set()  # ids of every row fed
        self.seen: set[str] = set()  # ids of every row received
        self.hits = 0
        self.graph_errors: list[str] = []
        self.stopping = False

    # ------------------------------------------------------------------ feeding

    def submit(self, batches: Sequence[Sequence[ManifestRow]]) -> None:
        """Queue ``batches`` (one part's plan) as tasks and start what can start."""
        keys = dict(self.tokens.keys) if self.tokens is not None else {}
        for group in task_groups(len(batches), self.plan.actors, self.opts.schedule):
            rows = [list(batches[k]) for k in group]
            self._queue.append(
                _Task(spec=encode_task(rows, keys), prompts=self._ship(r for b in rows for r in b))
            )
            self.fed.update(r.id for b in rows for r in b)
            self._tasks += 1
        self._grow()
        self._dispatch()

    def _ship(self, rows: Iterator[ManifestRow]) -> dict[str, Any]:
        """The object references of these rows' prompt files, each file read (and put) once per run.

        A file the driver cannot read is not shipped: the actor opens the path itself and the row
        fails there with the loader's message, as it would locally."""
        refs = {}
        for row in rows:
            path = str(row.prompt_audio)
            if path not in self._shipped:
                try:
                    self._shipped[path] = self.ray.put(Path(path).read_bytes())
                except OSError:
                    self._shipped[path] = None
            if self._shipped[path] is not None:
                refs[path] = self._shipped[path]
        return refs

    def _grow(self) -> None:
        while len(self.actors) < min(self.plan.actors, self._tasks):
            node = self._where[len(self.actors)] if len(self.actors) < len(self._where) else ""
            strategy = {}
            if node:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                strategy["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
            actor = self._remote.options(max_restarts=-1, max_task_retries=-1, **strategy,
                                         **self.plan.remote_args()).remote(*self._actor_args)
            self._idle.append(len(self.actors))
            self.actors.append(actor)
            self.started.append(node)
            self.on_start(list(self.started))

    def _dispatch(self) -> None:
        while self._queue and self._idle and not self.stopping:
            k, task = self._idle.popleft(), self._queue.popleft()
            self._running[self.actors[k].run.remote(task.spec, task.prompts)] = (k, task)

    # ------------------------------------------------------------------ results

    def results(self, *, block: bool) -> Iterator[RowResult]:
        """Each new row as it arrives (``block``: until no task is left; else only what is ready now).

        Returns early, with tasks still running, once the stop request is immediate (the caller
        then :meth:`kill`\\ s them)."""
        while self._running:
            self._watch_stop()
            if self.stop is not None and self.stop.immediate:
                return
            ready, _ = self.ray.wait(list(self._running), num_returns=1, timeout=POLL_SECONDS if block else 0)
            if not ready and not block:
                return
            for gen in ready:
                yield from self._take(gen)
            self._dispatch()

    def _take(self, gen: Any) -> Iterator[RowResult]:
        k, task = self._running[gen]
        try:
            item = self.ray.get(next(gen))
        except StopIteration:
            del self._running[gen]
            self._idle.append(k)
            return
        # gone for good (restarts exhausted): its task goes elsewhere
        except self.ray.exceptions.ActorDiedError:
            del self._running[gen]
            self.actors[k] = None
            self._queue.appendleft(task)
            if not any(a is not None for a in self.actors):
                raise CosycloneError("every Ray actor died; rerun the command to resume") from None
            return
        if isinstance(item, LoadFailed):  # the same error the local engine stops with before any row
            raise CosycloneError(item.message)
        if isinstance(item, TaskEnd):
            self.hits += item.hits
            self.graph_errors += [e for e in item.graph_errors if e not in self.graph_errors]
        elif item.id not in self.seen:  # (a re-run task repeats rows already received)
            self.seen.add(item.id)
            yield item

    def _watch_stop(self) -> None:
        """At the first look after a stop request: no queued task starts, the running ones are told."""
        if self.stop is None or not self.stop.requested or self.stopping:
            return
        self.stopping = True
        self._queue.clear()
        for k, _ in self._running.values():
            if self.actors[k] is not None:
                self.actors[k].stop.remote(self.stop.signal_name or "stop")

    def missing(self) -> list[str]:
        return sorted(self.fed - self.seen)

    def kill(self) -> None:
        """End every actor now (what is in flight is dropped); the pool takes no more work."""
        self.stopping = True
        self._queue.clear()
        self._running.clear()
        for actor in self.actors:
            if actor is not None:
                self.ray.kill(actor, no_restart=True)
        self.actors = [None] * len(self.actors)


def _actor_class(ray: Any) -> Any:
    """SynthActor as a Ray actor class whose :meth:`~SynthActor.stop` runs beside a running task."""
    ray.method(concurrency_group=CONTROL)(SynthActor.stop)
    return ray.remote(concurrency_groups={CONTROL: 1})(SynthActor)


class RayConnection:
    """The driver's Ray session: joined or started here (then left, or stopped, at :meth:`close`).

    The run's SIGTERM handler survives ``ray.init`` (:func:`~cosyclone.ray.cluster.init`). Ray's
    distributed tqdm replaces ``builtins.print`` process-wide when the first worker log line reaches
    the driver; ours is put back at the end."""

    def __init__(self, address: str | None) -> None:
        self.ray = require_ray()
        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        self._print = builtins.print
        self.started = False
        if not self.ray.is_initialized():
            init(self.ray, address=address, log_to_driver=True)
            self.started = True

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False
        builtins.print = self._print


class RaySource:
    """Rows made by a pool of Ray actors (the run's :class:`~cosyclone.run.drive.RowSource` under ``--engine
    ray``).

    The pool starts at the first part with rows to do: connected, planned on the live cluster
    (``on_record`` gets the plan and where each actor went, for runs.jsonl; ``log`` its lines) and
    refused before any actor starts when it does not fit. Each part's batches become tasks at once;
    rows stream back from :meth:`feed` (what is ready) and :meth:`drain` (the rest).
    """

    def __init__(self, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, folder: FolderOptions,
                 tokens: TokenStore | None, *, log: Callable[[str], None],
                 on_record: Callable[[dict[str, Any]], None], plan: RayPlan | None = None,
                 stop: StopRequest | None = None, on_plan: Callable[[RayPlan], Any] | None = None) -> None:
        self.cfg, self.policy, self.opts, self.folder, self.tokens = cfg, policy, opts, folder, tokens
        self.log, self.on_record, self.plan, self.stop, self.on_plan = log, on_record, plan, stop, on_plan
        self.pool: ActorPool | None = None
        self._conn: RayConnection | None = None
        self._record: dict[str, Any] = {}

    @property
    def hits(self) -> int:
        return self.pool.hits if self.pool is not None else 0

    @property
    def graph_errors(self) -> list[str]:
        return self.pool.graph_errors if self.pool is not None else []

    def feed(self, batches: Sequence[Sequence[ManifestRow]]) -> Iterator[RowResult]:
        if not batches or (self.stop is not None and self.stop.requested):
            return
        pool = self.pool or self._start()
        pool.submit(batches)
        yield from pool.results(block=False)

    def drain(self) -> Iterator[RowResult]:
        if self.pool is None:
            return
        yield from self.pool.results(block=True)
        missing = self.pool.missing()
        if missing and not self.pool.stopping:  # never report a partial run as complete
            raise CosycloneError(
                f"the Ray run returned no result for {len(missing)} rows ({', '.join(missing[:5])} "
                "...); rerun the command to resume them"
            )

    def cancel(self) -> None:
        if self.pool is not None:
            self.pool.kill()

    def close(self) -> None:
        """Stop the actors (a joined cluster keeps running), then the Ray this run started."""
        try:
            self.cancel()
        finally:
            if self._conn is not None:
                self._conn.close()

    def _start(self) -> ActorPool:
        self._conn = RayConnection(self.folder.ray_address)
        actors, threads = self.folder.ray_actors, self.folder.actor_threads
        if self.plan is not None:  # a plan made beforehand (the job's, a dry run's): what it was asked for
            actors, threads = self.plan.requested_actors, self.plan.requested_threads
        assert self.opts.batch_size is not None  # resolve_options sets it
        live = plan_run(
            self.cfg,
            self.policy,
            self.opts.batch_size,
            read_cluster(self._conn.ray),
            actors=actors,
            threads=threads,
        )
        self._record = {"ray_actors": self.folder.ray_actors, "actor_threads": self.folder.actor_threads,
                        "address": self.folder.ray_address, "plan": live.as_record(), "placed": []}
        self.on_record(self._record)
        if self.on_plan is not None:
            self.on_plan(live)
        for line in live.describe():
            self.log(line)
        live.check()  # before any actor starts
        self.pool = ActorPool(self._conn.ray, self.cfg, self.policy, self.opts, live, self.tokens, self.stop,
                              on_start=self._placed)
        return self.pool

    def _placed(self, nodes: list[str]) -> None:
        """runs.jsonl's ``ray.placed``: the node id of each actor started, in start order."""
        self._record = {**self._record, "placed": nodes}
        self.on_record(self._record)


def run_ray(
    cfg: ModelConfig,
    policy: DevicePolicy,
    opts: RunOptions,
    batches: Sequence[Sequence[ManifestRow]],
    *,
    tokens: TokenStore | None = None,
    address: str | None = None,
    plan: RayPlan | None = None,
    num_actors: int | None = None,
    actor_threads: int | None = None,
    on_plan: Callable[[RayPlan], Any] | None = None,
) -> Iterator[RowResult]:
    """Synthesize planned ``batches`` on Ray, outside a run folder (benchmarks); yields each row once.

    ``address``, ``num_actors`` / ``actor_threads`` as ``--ray-address``, ``--ray-actors`` /
    ``--actor-threads``; a ``plan`` made beforehand gives the last two instead. The plan made on the
    live cluster goes to ``on_plan`` and, if it does not fit, its refusal is raised as a
    :class:`CosycloneError` before any actor starts.
    """
    folder = FolderOptions(
        engine="ray", ray_address=address, ray_actors=num_actors, actor_threads=actor_threads
    )
    source = RaySource(cfg, policy, opts, folder, tokens, log=lambda line: None, plan=plan,
                       on_record=lambda record: None, on_plan=on_plan)
    try:
        yield from source.feed(batches)
        yield from source.drain()
    finally:
        source.close()
