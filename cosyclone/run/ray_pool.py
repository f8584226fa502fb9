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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.base.device import DevicePolicy
from cosyclone.engine import Engine, plan_batches
from cosyclone.errors import CosycloneError
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import RunOptions
from cosyclone.run.ray_cluster import read_cluster, require_ray
from cosyclone.run.ray_plan import RayPlan, plan_run
from cosyclone.run.writer import RowRecord

#: Test hook: when set in the workers' environment, each actor appends ``<pid>\n`` to this file as
#: it starts a batch, so a test can kill a worker that is known to be mid-batch.
PID_FILE_ENV = "COSYCLONE_RAY_PID_FILE"
LOAD_ERROR = "load_error"  # the key of the one result an actor returns when its model did not load


def row_to_dict(row: ManifestRow) -> dict[str, Any]:
    """A manifest row as JSON-able data (the prompt path as a string)."""
    d = asdict(row)
    d["prompt_audio"] = str(row.prompt_audio)
    return d


def row_from_dict(d: dict[str, Any]) -> ManifestRow:
    return ManifestRow(**{**d, "prompt_audio": Path(d["prompt_audio"])})


class SynthActor:
    """One model replica: stages loaded once, then one planned batch per call (Ray Data ``map_batches``)."""

    def __init__(self, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, threads: int | None,
                 token_root: str | None = None) -> None:
        from cosyclone.base.device import apply_precision

        apply_precision()  # process-wide (no TF32): the driver's resolve() switched only the driver's process
        if threads is not None:  # explicit, not Ray's OMP_NUM_THREADS: CPU bytes depend on the thread count
            import torch

            torch.set_num_threads(threads)
        self.opts = opts
        self.token_root = token_root  # the run folder's stage-0 checkpoint (None: the run keeps none)
        self._pid_file = os.environ.get(PID_FILE_ENV)
        self.load_error: str | None = None
        try:
            self.engine = Engine.load(None, opts, cfg=cfg)
        except CosycloneError as exc:  # a bad model directory: told to the driver by the first batch
            self.load_error = str(exc)  # (raised here, Ray would bury it in an ActorDiedError traceback)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """One task: a group of consecutive planned batches, run by the engine under the run's schedule."""
        from cosyclone.run.token_store import TokenStore

        ids: list[str] = []
        diags: list[str] = []
        wavs: list[np.ndarray] = []
        hits: list[int] = []
        if self.load_error is not None:
            return {"id": np.array([""], dtype=object), "wav": [np.zeros(0, np.float32)], "hits": [0],
                    "diagnostics": np.array([json.dumps({LOAD_ERROR: self.load_error})], dtype=object)}
        for task_json in batch["task"]:
            if self._pid_file:
                with open(self._pid_file, "a", encoding="utf-8") as fh:
                    fh.write(f"{os.getpid()}\n")
            task = json.loads(str(task_json))
            batches = [[row_from_dict(d) for d in b] for b in task["batches"]]
            tokens = TokenStore(Path(self.token_root), task["keys"]) if self.token_root else None
            for rec in self.engine.run(batches=batches, opts=self.opts, tokens=tokens):
                ids.append(rec.row_id)
                diags.append(json.dumps(rec.diagnostics, ensure_ascii=False))
                wavs.append(np.zeros(0, np.float32) if rec.wav is None else np.asarray(rec.wav, np.float32))
                hits.append(0)
            if hits and tokens is not None:
                hits[-1] = tokens.hits  # the task's checkpoint hits, on its last row
        return {"id": np.array(ids, dtype=object), "diagnostics": np.array(diags, dtype=object), "wav": wavs,
                "hits": hits}


def run_ray(cfg: ModelConfig, policy: DevicePolicy, rows: Sequence[ManifestRow], opts: RunOptions,
            submit: Callable[[RowRecord], None], progress: Callable[[RowRecord], Any] | None = None, *,
            address: str | None = None, plan: RayPlan | None = None, num_actors: int | None = None,
            actor_threads: int | None = None, on_plan: Callable[[RayPlan], Any] | None = None,
            tokens: Any = None, batches: Sequence[Sequence[ManifestRow]] | None = None) -> list[RowRecord]:
    """Synthesize ``rows`` (the caller's already-filtered to-do list) on Ray; same contract as
    :meth:`cosyclone.engine.Engine.run`: each record goes to ``submit`` as it arrives (diagnostics carry
    ``wav``), ``progress`` gets each finished record, and the records come back without audio.

    ``address``: a running cluster (``auto``, ``ray://host:10001``, ``host:6379``); None joins the
    cluster this machine started with ``ray start`` or else starts a local one (stopped at the end).
    ``num_actors`` / ``actor_threads``: ``--ray-actors`` / ``--actor-threads`` (None: the rule of
    :mod:`cosyclone.run.ray_plan`); a ``plan`` made beforehand (a dry run's, :func:`~cosyclone.run.ray_cluster.plan_cluster`)
    gives them instead. Either way the run is planned again on the live cluster's nodes, which may
    differ from what was read before (a node joined or left, a local Ray's memory figure); that plan
    goes to ``on_plan`` (to be shown and recorded) and, if it does not fit, its refusal is raised
    as a :class:`CosycloneError` before any actor starts.
    """
    if not rows:
        return []
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
        return _run(ray, cfg, policy, rows, opts, submit, progress, live, tokens, batches)
    finally:
        if started:
            ray.shutdown()
        builtins.print = saved_print


def _run(ray: Any, cfg: ModelConfig, policy: DevicePolicy, rows: Sequence[ManifestRow], opts: RunOptions,
         submit: Callable[[RowRecord], None], progress: Callable[[RowRecord], Any] | None,
         plan: RayPlan, tokens: Any, planned: Sequence[Sequence[ManifestRow]] | None = None) -> list[RowRecord]:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI shows its own per-row bar
    batches = planned if planned is not None else plan_batches(rows, opts.batch_size, opts.token_budget)
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
    out: list[RowRecord] = []
    seen: set[str] = set()
    for rec, hits in _records(ds):
        if tokens is not None:
            tokens.hits += hits
        if rec.row_id in seen:  # a re-run batch repeating a row already written
            continue
        seen.add(rec.row_id)
        submit(rec)
        done = RowRecord(row_id=rec.row_id, wav=None, diagnostics=rec.diagnostics)
        out.append(done)
        if progress is not None:
            progress(done)
    missing = [r.id for r in rows if r.id not in seen]
    if missing:  # Ray Data finished without them: never report a partial run as complete
        raise CosycloneError(f"the Ray run returned no result for {len(missing)} rows ({', '.join(missing[:5])} ...); "
                             "rerun the command to resume them")
    return out


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


def _records(ds: Any) -> Iterator[tuple[RowRecord, int]]:
    """The dataset's results as records with the task's checkpoint hits, in arrival order (wav None
    for a failed row)."""
    for item in ds.iter_rows():
        diagnostics = json.loads(item["diagnostics"])
        if LOAD_ERROR in diagnostics:  # the same error the local engine stops with before any row
            raise CosycloneError(diagnostics[LOAD_ERROR])
        ok = diagnostics.get("status") == "ok"
        wav = np.asarray(item["wav"], dtype=np.float32).reshape(-1) if ok else None
        yield RowRecord(row_id=str(item["id"]), wav=wav, diagnostics=diagnostics), int(item.get("hits", 0))
