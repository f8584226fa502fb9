"""``--engine ray``: the local engine's batches, run by a pool of Ray actors, written by the driver.

Why Ray Data rather than our own scheduler: it already places actors on GPUs across machines,
restarts a killed actor and re-runs its batch (``max_restarts`` / ``max_task_retries`` are -1 for
actor pools), and streams results back while later batches still run.

The dataset is the local engine's batch plan (:func:`~cosyclone.engine.plan_batches`), grouped
into tasks of consecutive batches (:func:`task_groups`), so a row is computed in exactly the batch
it would be computed in locally and its WAV is byte-identical. :class:`SynthActor` loads one
:class:`~cosyclone.engine.Engine` and runs each task through it under the run's ``--schedule``
and with the run's stage-0 token checkpoint (the output folder's: actors on other machines keep it
only where that folder is shared): there is no second pipeline. Everything crossing process
boundaries is plain data: rows as JSON lists of :class:`~cosyclone.manifest.ManifestRow` dicts,
results as a row id, the diagnostics line as JSON and the wave as a float32 numpy array. The driver
hands each record to ``submit`` (the same writer as the local engine) once: a task re-run after a
kill can only repeat rows the driver already has, and those are dropped by id.

Resources: how many actors, with how many torch threads, and what each asks Ray for (CPUs, GPUs,
``memory=`` its measured footprint) is :mod:`cosyclone.run.ray_plan`'s: :func:`run_ray` plans on the
live cluster's nodes after connecting and refuses a run that cannot fit before any actor starts.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.base.device import DevicePolicy
from cosyclone.engine import Engine, RowResult
from cosyclone.errors import CosycloneError
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import FolderOptions, RunOptions
from cosyclone.run.ray_cluster import read_cluster, require_ray
from cosyclone.run.ray_plan import RayPlan, plan_run
from cosyclone.run.token_store import TokenStore


def row_to_dict(row: ManifestRow) -> dict[str, Any]:
    """A manifest row as JSON-able data (the prompt path as a string)."""
    d = asdict(row)
    d["prompt_audio"] = str(row.prompt_audio)
    return d


def row_from_dict(d: dict[str, Any]) -> ManifestRow:
    return ManifestRow(**{**d, "prompt_audio": Path(d["prompt_audio"])})


class SynthActor:
    """One model replica: stages loaded once, then one task of planned batches per call (``map_batches``)."""

    def __init__(self, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, threads: int | None,
                 token_root: str | None = None) -> None:
        from cosyclone.base.device import apply_precision

        apply_precision()  # process-wide (no TF32): the driver's resolve() switched only the driver's process
        if threads is not None:  # explicit, not Ray's OMP_NUM_THREADS: CPU bytes depend on the thread count
            import torch

            torch.set_num_threads(threads)
        self.opts = opts
        self.token_root = token_root  # the run folder's stage-0 checkpoint (None: the run keeps none)
        self.load_error: str | None = None
        try:
            self.engine: Engine | None = Engine.load(None, opts, cfg=cfg)
        except CosycloneError as exc:  # a bad model directory: told to the driver by the first batch
            self.engine = None
            self.load_error = str(exc)  # (raised here, Ray would bury it in an ActorDiedError traceback)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """One task: a group of consecutive planned batches, run by the engine under the run's schedule.

        Results travel pickled (a :class:`RowResult` with its audio), one per row, with the task's
        stage-0 checkpoint hits on its last row."""
        results: list[bytes] = []
        hits: list[int] = []
        if self.load_error is not None or self.engine is None:
            return {"result": np.array([b""], dtype=object), "hits": [0],
                    "load_error": np.array([self.load_error or "the model did not load"], dtype=object)}
        for task_json in batch["task"]:
            task = json.loads(str(task_json))
            batches = [[row_from_dict(d) for d in b] for b in task["batches"]]
            tokens = TokenStore(Path(self.token_root), task["keys"]) if self.token_root else None
            for res in self.engine.run(batches=batches, opts=self.opts, tokens=tokens):
                results.append(pickle.dumps(res))
                hits.append(0)
            if hits and tokens is not None:
                hits[-1] = tokens.hits  # the task's checkpoint hits, on its last row
        return {"result": np.array(results, dtype=object), "hits": hits,
                "load_error": np.array([""] * len(results), dtype=object)}


class RaySource:
    """Rows made by a pool of Ray actors (the run's :class:`~cosyclone.run.drive.RowSource` under ``--engine ray``).

    The batches of every part are gathered by :meth:`feed` and run together by :meth:`drain`, so the
    pool balances over the whole run; the plan is made on the live cluster as the pool starts
    (``on_record`` gets it for runs.jsonl, ``log`` its lines) and a plan that does not fit is refused
    before any actor starts.
    """

    def __init__(self, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, folder: FolderOptions,
                 tokens: TokenStore | None, *, log: Callable[[str], None],
                 on_record: Callable[[dict[str, Any]], None], plan: RayPlan | None = None) -> None:
        self.cfg, self.policy, self.opts, self.folder, self.tokens = cfg, policy, opts, folder, tokens
        self.log, self.on_record, self.plan = log, on_record, plan
        self.hits = 0
        self.graph_errors: list[str] = []
        self._batches: list[list[ManifestRow]] = []

    def feed(self, batches: Sequence[Sequence[ManifestRow]]) -> Iterator[RowResult]:
        self._batches += [list(b) for b in batches]
        return iter(())

    def cancel(self) -> None:
        self._batches = []

    def drain(self) -> Iterator[RowResult]:
        batches, self._batches = self._batches, []
        if not batches:
            return
        yield from run_ray(self.cfg, self.policy, self.opts, batches, tokens=self.tokens,
                           address=self.folder.ray_address, plan=self.plan, num_actors=self.folder.ray_actors,
                           actor_threads=self.folder.actor_threads, on_plan=self._started, on_hits=self._hit)

    def _hit(self, n: int) -> None:
        self.hits += n

    def _started(self, plan: RayPlan) -> None:
        """The plan made on the live cluster (what runs.jsonl records), shown as it starts."""
        self.on_record({"ray_actors": self.folder.ray_actors, "actor_threads": self.folder.actor_threads,
                        "address": self.folder.ray_address, "plan": plan.as_record()})
        for line in plan.describe():
            self.log(line)


def run_ray(cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, batches: Sequence[Sequence[ManifestRow]], *,
            tokens: TokenStore | None = None, address: str | None = None, plan: RayPlan | None = None,
            num_actors: int | None = None, actor_threads: int | None = None,
            on_plan: Callable[[RayPlan], Any] | None = None,
            on_hits: Callable[[int], Any] | None = None) -> Iterator[RowResult]:
    """Synthesize planned ``batches`` on Ray; yields each row's result (audio included) as it arrives,
    each row once (a task re-run after a kill repeats rows already yielded: they are dropped by id).

    ``address``: a running cluster (``auto``, ``ray://host:10001``, ``host:6379``); None joins the
    cluster this machine started with ``ray start`` or else starts a local one (stopped at the end).
    ``num_actors`` / ``actor_threads``: ``--ray-actors`` / ``--actor-threads`` (None: the rule of
    :mod:`cosyclone.run.ray_plan`); a ``plan`` made beforehand (a dry run's) gives them instead.
    Either way the run is planned again on the live cluster's nodes; that plan goes to ``on_plan``
    and, if it does not fit, its refusal is raised as a :class:`CosycloneError` before any actor starts.
    """
    import builtins

    ray = require_ray()
    # Ray's distributed tqdm replaces builtins.print process-wide when the first worker log line
    # reaches the driver; keep this process's print ours.
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
    saved_print = builtins.print
    started = False
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=True)
        started = True
    try:
        if plan is not None:
            num_actors, actor_threads = plan.requested_actors, plan.requested_threads
        live = plan_run(cfg, policy, opts.batch_size, read_cluster(ray), actors=num_actors, threads=actor_threads)
        if on_plan is not None:
            on_plan(live)
        live.check()
        yield from _run(ray, cfg, policy, opts, batches, live, tokens, on_hits)
    finally:
        if started:
            ray.shutdown()
        builtins.print = saved_print


def _run(ray: Any, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, batches: Sequence[Sequence[ManifestRow]],
         plan: RayPlan, tokens: TokenStore | None, on_hits: Callable[[int], Any] | None) -> Iterator[RowResult]:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI shows its own per-row bar
    groups = task_groups(len(batches), plan.pool_size(len(batches)), opts.schedule)
    keys = dict(tokens.keys) if tokens is not None else {}
    items = [{"task": json.dumps({"batches": [[row_to_dict(r) for r in batches[k]] for k in group],
                                  "keys": {r.id: keys[r.id] for k in group for r in batches[k] if r.id in keys}},
                                 ensure_ascii=False)} for group in groups]
    token_root = str(tokens.root) if tokens is not None else None
    actor_opts = replace(opts, threads=plan.threads if plan.threads is not None else opts.threads)
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        SynthActor, fn_constructor_args=(cfg, policy, actor_opts, plan.threads, token_root), batch_size=1,
        batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=plan.pool_size(len(items))),
        **plan.remote_args())
    seen: set[str] = set()
    for item in ds.iter_rows():
        if item.get("load_error"):  # the same error the local engine stops with before any row
            raise CosycloneError(str(item["load_error"]))
        if on_hits is not None:
            on_hits(int(item.get("hits", 0)))
        res: RowResult = pickle.loads(item["result"])
        if res.id in seen:  # a re-run batch repeating a row already yielded
            continue
        seen.add(res.id)
        yield res
    missing = [r.id for b in batches for r in b if r.id not in seen]
    if missing:  # Ray Data finished without them: never report a partial run as complete
        raise CosycloneError(f"the Ray run returned no result for {len(missing)} rows ({', '.join(missing[:5])} ...); "
                             "rerun the command to resume them")


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
