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

Resources: on a GPU policy each actor asks for ``num_gpus=1`` and one CPU, and there is one actor
per GPU in the cluster. On CPU each actor asks for half a CPU and runs one torch thread, one actor
per cluster CPU: whole-CPU actors would hold every CPU of a small machine, and a Ray Data task that
needs one (a file read, say) would wait for ever; half CPUs leave room for the driver and Ray's tasks.
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
from .writer import RowRecord

INSTALL_HINT = "--engine ray needs Ray: pip install 'cosyclone[ray]' (or pip install 'ray[data]')"
CPU_PER_CPU_ACTOR = 0.5  # a CPU actor's share of one core (see the module docstring)
CPU_PER_GPU_ACTOR = 1.0  # the CPU a GPU actor asks for next to its GPU (frontend, padding, numpy)
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


def actor_resources(policy: DevicePolicy, cpus_per_actor: float | None) -> dict[str, float]:
    """What each actor asks Ray for (``num_gpus`` only on a GPU policy)."""
    if policy.device.type == "cpu":
        return {"num_cpus": CPU_PER_CPU_ACTOR if cpus_per_actor is None else cpus_per_actor}
    return {"num_cpus": CPU_PER_GPU_ACTOR if cpus_per_actor is None else cpus_per_actor, "num_gpus": 1}


def actor_threads(policy: DevicePolicy, resources: dict[str, float]) -> int | None:
    """torch intra-op threads of a CPU actor: the whole CPUs it asked for, at least one (None on GPU).

    On CPU a row's fp32 bytes depend on this count (reductions split differently), as they do for
    the local engine run with another ``torch.set_num_threads``; they never depend on the actor or batch.
    """
    return max(1, int(resources["num_cpus"])) if policy.device.type == "cpu" else None


def default_actors(policy: DevicePolicy, cluster: dict[str, float]) -> int:
    """One actor per GPU of the cluster on a GPU policy, else one per cluster CPU."""
    key = "CPU" if policy.device.type == "cpu" else "GPU"
    return max(1, int(cluster.get(key, 1)))


def run_ray(cfg: ModelConfig, policy: DevicePolicy, rows: Sequence[ManifestRow], opts: RunOptions,
            submit: Callable[[RowRecord], None], progress: Callable[[RowRecord], Any] | None = None, *,
            address: str | None = None, num_actors: int | None = None,
            cpus_per_actor: float | None = None) -> list[RowRecord]:
    """Synthesize ``rows`` (the caller's already-filtered to-do list) on Ray; same contract as
    :func:`cosyclone.pipeline.run`: each record goes to ``submit`` as it arrives (diagnostics carry
    ``wav``), ``progress`` gets each finished record, and the records come back without audio.

    ``address``: a running cluster (``auto``, ``ray://host:10001``, ``host:6379``); None joins the
    cluster this machine started with ``ray start`` or else starts a local one (stopped at the end).
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
        return _run(ray, cfg, policy, rows, opts, submit, progress, num_actors, cpus_per_actor)
    finally:
        if started:
            ray.shutdown()
        builtins.print = saved_print


def _run(ray: Any, cfg: ModelConfig, policy: DevicePolicy, rows: Sequence[ManifestRow], opts: RunOptions,
         submit: Callable[[RowRecord], None], progress: Callable[[RowRecord], Any] | None,
         num_actors: int | None, cpus_per_actor: float | None) -> list[RowRecord]:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI shows its own per-row bar
    batches = plan_batches(rows, opts.batch_size, opts.token_budget)
    items = [{"rows": json.dumps([row_to_dict(r) for r in b], ensure_ascii=False)} for b in batches]
    size = num_actors or default_actors(policy, ray.cluster_resources())
    size = max(1, min(size, len(items)))
    resources = actor_resources(policy, cpus_per_actor)
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        SynthActor, fn_constructor_args=(cfg, policy, opts, actor_threads(policy, resources)), batch_size=1,
        batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=size), **resources)
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
