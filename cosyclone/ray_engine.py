"""``--engine ray``: the local engine's batches, run by a pool of Ray actors, written by the driver.

Why Ray Data rather than our own scheduler: it already places actors on GPUs across machines,
restarts a killed actor and re-runs its batch (``max_restarts`` / ``max_task_retries`` are -1 for
actor pools), and streams results back while later batches still run.

The pipeline is one dataset of *planned batches* (:func:`~cosyclone.pipeline.plan_batches`, the
local engine's plan, so a row is computed in exactly the batch it would be computed in locally and
its WAV is byte-identical) mapped by :class:`SynthActor`, which loads the stages once
(:func:`~cosyclone.pipeline.load_stages`) and runs each batch through the local engine's own
guarded batch call: there is no second pipeline. Everything crossing process boundaries is plain
data: rows as JSON lists of :class:`~cosyclone.manifest.ManifestRow` dicts, results as a row id,
the diagnostics line as JSON and the wave as a float32 numpy array. The driver hands each record to
``submit`` (the same writer as the local engine) once: a batch re-run after a kill can only
repeat rows the driver already has, and those are dropped by id.

Resources: how many actors, with how many torch threads, and what each asks Ray for (CPUs, GPUs,
``memory=`` its measured footprint) is :mod:`cosyclone.ray_plan`'s: :func:`run_ray` plans on the
live cluster's nodes after connecting and refuses a run that cannot fit before any actor starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig
from .device import DevicePolicy
from .errors import CosycloneError
from .manifest import ManifestRow
from .pipeline import RunOptions, load_stages, plan_batches
from .ray_plan import RayPlan, plan_run, read_cluster
from .writer import RowRecord

INSTALL_HINT = "--engine ray needs Ray: pip install 'cosyclone[ray]' (or pip install 'ray[data]')"
#: Test hook: when set in the workers' environment, each actor appends ``<pid>\n`` to this file as
#: it starts a batch, so a test can kill a worker that is known to be mid-batch.
PID_FILE_ENV = "COSYCLONE_RAY_PID_FILE"
LOAD_ERROR = "load_error"  # the key of the one result an actor returns when its model did not load


def require_ray() -> Any:
    """The ``ray`` module, or a :class:`CosycloneError` that says how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401 - the data extra, not only ray core
    except ImportError as exc:
        raise CosycloneError(f"{INSTALL_HINT} ({exc})") from None
    return ray


def row_to_dict(row: ManifestRow) -> dict[str, Any]:
    """A manifest row as JSON-able data (the prompt path as a string)."""
    d = asdict(row)
    d["prompt_audio"] = str(row.prompt_audio)
    return d


def row_from_dict(d: dict[str, Any]) -> ManifestRow:
    return ManifestRow(**{**d, "prompt_audio": Path(d["prompt_audio"])})


class SynthActor:
    """One model replica: stages loaded once, then one planned batch per call (Ray Data ``map_batches``)."""

    def __init__(self, cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, threads: int | None) -> None:
        from .device import apply_precision

        apply_precision()  # process-wide (no TF32): the driver's resolve() switched only the driver's process
        if threads is not None:  # explicit, not Ray's OMP_NUM_THREADS: CPU bytes depend on the thread count
            import torch

            torch.set_num_threads(threads)
        self.opts = opts
        self._pid_file = os.environ.get(PID_FILE_ENV)
        self.load_error: str | None = None
        try:
            self.stages = load_stages(cfg, policy, opts.load_format, text_frontend=opts.text_frontend)
        except CosycloneError as exc:  # a bad model directory: told to the driver by the first batch
            self.load_error = str(exc)  # (raised here, Ray would bury it in an ActorDiedError traceback)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        from .pipeline import synthesize_batch_isolated

        ids: list[str] = []
        diags: list[str] = []
        wavs: list[np.ndarray] = []
        if self.load_error is not None:
            return {"id": np.array([""], dtype=object), "wav": [np.zeros(0, np.float32)],
                    "diagnostics": np.array([json.dumps({LOAD_ERROR: self.load_error})], dtype=object)}
        for rows_json in batch["rows"]:
            if self._pid_file:
                with open(self._pid_file, "a", encoding="utf-8") as fh:
                    fh.write(f"{os.getpid()}\n")
            rows = [row_from_dict(d) for d in json.loads(str(rows_json))]
            for rec in synthesize_batch_isolated(self.stages, rows, self.opts):
                ids.append(rec.row_id)
                diags.append(json.dumps(rec.diagnostics, ensure_ascii=False))
                wavs.append(np.zeros(0, np.float32) if rec.wav is None else np.asarray(rec.wav, np.float32))
        return {"id": np.array(ids, dtype=object), "diagnostics": np.array(diags, dtype=object), "wav": wavs}


def run_ray(cfg: ModelConfig, policy: DevicePolicy, rows: Sequence[ManifestRow], opts: RunOptions,
            submit: Callable[[RowRecord], None], progress: Callable[[RowRecord], Any] | None = None, *,
            address: str | None = None, plan: RayPlan | None = None, num_actors: int | None = None,
            actor_threads: int | None = None, on_plan: Callable[[RayPlan], Any] | None = None) -> list[RowRecord]:
    """Synthesize ``rows`` (the caller's already-filtered to-do list) on Ray; same contract as
    :func:`cosyclone.pipeline.run`: each record goes to ``submit`` as it arrives (diagnostics carry
    ``wav``), ``progress`` gets each finished record, and the records come back without audio.

    ``address``: a running cluster (``auto``, ``ray://host:10001``, ``host:6379``); None joins the
    cluster this machine started with ``ray start`` or else starts a local one (stopped at the end).
    ``num_actors`` / ``actor_threads``: ``--ray-actors`` / ``--actor-threads`` (None: the rule of
    :mod:`cosyclone.ray_plan`); a ``plan`` made beforehand (a dry run's, :func:`~cosyclone.ray_plan.plan_cluster`)
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
        return _run(ray, cfg, policy, rows, opts, submit, progress, live)
    finally:
        if started:
            ray.shutdown()
        builtins.print = saved_print


def _run(ray: Any, cfg: ModelConfig, policy: DevicePolicy, rows: Sequence[ManifestRow], opts: RunOptions,
         submit: Callable[[RowRecord], None], progress: Callable[[RowRecord], Any] | None,
         plan: RayPlan) -> list[RowRecord]:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI shows its own per-row bar
    batches = plan_batches(rows, opts.batch_size, opts.token_budget)
    items = [{"rows": json.dumps([row_to_dict(r) for r in b], ensure_ascii=False)} for b in batches]
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        SynthActor, fn_constructor_args=(cfg, policy, opts, plan.threads), batch_size=1, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=plan.pool_size(len(items))), **plan.remote_args())
    out: list[RowRecord] = []
    seen: set[str] = set()
    for rec in _records(ds):
        if rec.row_id in seen:  # a re-run batch repeating a row already written
            continue
        seen.add(rec.row_id)
        rec.diagnostics["wav"] = f"wavs/{rec.row_id}.wav" if rec.wav is not None else None
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


def _records(ds: Any) -> Iterator[RowRecord]:
    """The dataset's results as records, in arrival order (wav None for a failed row)."""
    for item in ds.iter_rows():
        diagnostics = json.loads(item["diagnostics"])
        if LOAD_ERROR in diagnostics:  # the same error the local engine stops with before any row
            raise CosycloneError(diagnostics[LOAD_ERROR])
        ok = diagnostics.get("status") == "ok"
        wav = np.asarray(item["wav"], dtype=np.float32).reshape(-1) if ok else None
        yield RowRecord(row_id=str(item["id"]), wav=wav, diagnostics=diagnostics)
