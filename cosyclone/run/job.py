"""A synthesis run into an output folder: the one object ``cosyclone synth`` and
:meth:`cosyclone.api.CosyClone.synth_folder` share.

Owns the folder's side of a run: the run's options checked as a whole, the folder lock, content
hashes and row fingerprints, the resume plan, the choice of engine (this process or a Ray actor
pool), the writer, compaction of the journal, the stage-0 checkpoint's cleanup, ``summary.json``
and ``runs.jsonl``. A row whose preparation here raises (its prompt cannot be hashed, say) fails
alone, with a record, and the other rows run.

Must not: parse command lines or print (messages go to the ``log`` callable and the totals come
back as a :class:`JobSummary`, which the caller renders), wire stages (that is
:class:`cosyclone.engine.Engine` and :func:`cosyclone.run.ray_pool.run_ray`), or touch a row's audio.
"""

from __future__ import annotations

import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from .. import options as O
from ..engine import Engine, RowRecord, model_config, plan_batches, resolve_options
from ..engine.outcome import failed_record
from ..engine.stages import row_seed_of
from ..errors import CosycloneError
from ..manifest import Manifest, ManifestRow, Shard, read_manifest
from ..options import FolderOptions, RunOptions
from . import fingerprint, lock
from . import folder as runfolder
from .record import Stamper, devices, graphs_record, versions

EXIT_OK, EXIT_ROWS_FAILED = 0, 3  # a finished run: every row done; some rows failed or were rejected


class ProgressSink(Protocol):
    """What :meth:`SynthJob.run` reports finished rows to (:class:`cosyclone.progress.Progress` is one)."""

    def update(self, record: Any) -> None: ...

    def close(self) -> None: ...


#: Builds the progress sink once the number of rows to do is known (it is known only under the lock).
ProgressFactory = Callable[[int], ProgressSink]


@dataclass(frozen=True)
class JobPlan:
    """What a run would do now (``synth --dry-run``); making it loads no model and writes nothing."""

    valid_rows: int  # rows of this shard that passed validation
    rejected: int  # lines of this shard that validation refused (each in Manifest.errors)
    done: int  # rows skipped: complete and with an unchanged fingerprint
    todo: int  # rows to synthesize (new, changed, failed before or incomplete)
    unprepared: int  # rows whose fingerprint could not be made (they fail, each with its reason)
    batches: int  # planned batches of the rows to do (engine.plan_batches)
    resume: str  # what the resume plan says about redone, retried and foreign rows ("" when nothing)
    device: str  # the device the stages run on
    dtype: str  # the resolved run dtype
    engine: str  # local | ray
    engine_lines: tuple[str, ...] = ()  # the engine's own plan (Ray: actors per node, threads, memory)
    refusal: str | None = None  # why the engine cannot run this (Ray: an actor larger than a node's memory)

    def line(self) -> str:
        """The one-line plan ``synth --dry-run`` prints."""
        extra = f", {self.unprepared} unpreparable" if self.unprepared else ""
        return (f"{self.valid_rows} valid rows, {self.rejected} rejected, {self.done} already done, "
                f"{self.todo} to synthesize in {self.batches} batches on {self.device} ({self.dtype}){extra}")


@dataclass(frozen=True)
class JobSummary:
    """The end of a run: the folder's totals, this invocation's figures, and what went wrong."""

    totals: dict[str, Any]  # report.folder_totals over every record in the folder (summary.json's top level)
    last_run: dict[str, Any]  # this invocation (summary.json's last_run, one line of runs.jsonl)
    failed: list[dict[str, Any]]  # this run's failed row records (line, id, error), in arrival order
    write_error: str | None  # why the folder could not be written (rows finished before it are kept)
    written: int  # row records the writer committed in this run

    @property
    def exit_code(self) -> int:
        """0 when every row of the shard is done, 3 when some failed or were rejected (a write error is 4,
        the caller's to report)."""
        return EXIT_ROWS_FAILED if self.last_run["failed"] + self.last_run["invalid"] else EXIT_OK


@dataclass
class _Prepared:
    """A folder's rows sorted out under its lock: fingerprints, the resume plan, rows that failed already."""

    ctx: fingerprint.RunContext
    fps: dict[str, tuple[str, dict[str, str]]]  # row id -> (fingerprint, parts) for every preparable row
    failed: list[RowRecord]  # rows whose fingerprint raised: failed records, ready for the writer
    resume: runfolder.ResumePlan


class SynthJob:
    """Synthesize a manifest (or one shard of it) into an output folder, resumably.

    Build it with :meth:`open` (reads and validates the manifest and options; loads no model), look
    at :meth:`plan`, then :meth:`run`. ``tts`` is an already loaded
    :class:`~cosyclone.engine.Engine` to run the local rows on; without it :meth:`run` loads one
    when there is work (and never for Ray, whose actors load their own).
    """

    def __init__(self, manifest: Manifest, out: Path, opts: RunOptions, *, cfg: Any, policy: Any,
                 model_dir: Path | None, folder: FolderOptions = FolderOptions(),
                 log: Callable[[str], None] | None = None, engine: Engine | None = None,
                 manifest_label: str | None = None,
                 started_at: float | None = None) -> None:
        self.full = manifest  # every row: another shard's rows are not "foreign" to the folder
        self.rows = manifest.shard(Shard.parse(folder.shard)) if folder.shard else manifest  # this shard's
        self.out, self.opts, self.cfg, self.policy, self.model_dir = Path(out), opts, cfg, policy, model_dir
        self.folder, self.engine = folder, engine
        self.log = log or (lambda msg: None)
        self.manifest_label = manifest_label if manifest_label is not None else str(manifest.path)
        self.tag = runfolder.shard_tag(folder.shard)
        self.started_at = time.time() if started_at is None else started_at
        self._ray: Any = None  # the RayPlan of the run in progress (engine ray), for runs.jsonl
        self._graph_errors: list[str] = []  # failed CUDA graph captures of the local engine (what runs.jsonl says)
        O.check(opts, folder)

    @classmethod
    def open(cls, manifest: str | Path, out: str | Path, *, model_dir: str | Path | None = None,
             log: Callable[[str], None] | None = None, loaded: Engine | None = None, **options: Any) -> SynthJob:
        """Read ``manifest``, check the options and resolve device, dtype and model configuration.

        ``options`` are :mod:`cosyclone.options` fields, run and folder alike (``seed``,
        ``batch_size``, ``top_k``, ``shard``, ``engine``, ...). ``loaded``: an already loaded
        :class:`~cosyclone.engine.Engine` to run on (its model options win; the API passes its own).
        Raises :class:`CosycloneError` for anything a user must fix first: an unreadable manifest,
        an option out of range, a model directory that does not load as configuration, Ray missing
        for ``engine="ray"``.
        """
        started = time.time()
        opts, folder = O.split(options)  # checked before devices are resolved or the model read
        if loaded is not None:
            opts = replace(opts, **{k: getattr(loaded.opts, k) for k in O.MODEL_FIELDS})
        full = read_manifest(manifest, text_frontend=opts.text_frontend)
        opts, policy = resolve_options(opts)
        if loaded is not None:
            policy = loaded.policy  # as the model was loaded (what was requested included)
        cfg = loaded.cfg if loaded is not None else model_config(model_dir, opts.load_format)
        if folder.engine == "ray":
            from .ray_cluster import require_ray

            require_ray()  # before any work: say how to install it
        if not folder.command:
            folder = replace(folder, command=" ".join(sys.argv))
        return cls(full, Path(out), opts, cfg=cfg, policy=policy,
                   model_dir=Path(model_dir) if model_dir is not None else None, folder=folder, log=log,
                   engine=loaded, manifest_label=str(manifest), started_at=started)

    # ------------------------------------------------------------------ planning

    def plan(self) -> JobPlan:
        """What :meth:`run` would do if started now (the folder is read, not locked or written)."""
        runfolder.check_writable(self.out)
        prep = self._prepare(fingerprint.HashCache())
        if prep.resume.describe():
            self.log(prep.resume.describe())
        ray = self.ray_plan() if self.folder.engine == "ray" else None
        return JobPlan(valid_rows=len(self.rows.rows), rejected=len(self.rows.errors), done=len(prep.resume.done),
                       todo=len(prep.resume.todo), unprepared=len(prep.failed),
                       batches=len(plan_batches(prep.resume.todo, self.opts.batch_size, self.opts.token_budget)),
                       resume=prep.resume.describe(), device=str(self.policy.device), dtype=self.policy.dtype_name,
                       engine=self.folder.engine, engine_lines=tuple(ray.describe()) if ray else (),
                       refusal=ray.refusal if ray else None)

    def ray_plan(self) -> Any:
        """The Ray actors this run would get on the cluster as it is now (:func:`cosyclone.run.ray_cluster.plan_cluster`:
        ``--ray-actors``/``--actor-threads`` or the sizing rule, the measured footprint, each node's shape)."""
        from .ray_cluster import plan_cluster

        return plan_cluster(self.cfg, self.policy, self.opts.batch_size, address=self.folder.ray_address,
                            actors=self.folder.ray_actors, threads=self.folder.actor_threads)

    def _prepare(self, hashes: fingerprint.HashCache) -> _Prepared:
        """Fingerprint every row and plan the resume against the folder's records.

        The model's content hash is the run's (an unreadable model directory stops the run, as
        unusable input); a row's own hash (its prompt's content, its text) is the row's: a row
        whose fingerprint raises becomes a failed record and the others go on.
        """
        try:
            ctx = fingerprint.RunContext(
                model=fingerprint.model_content_hash(self.model_dir, hashes,
                                                   dummy_tag="released" if self.opts.load_format == "dummy" else ""),
                dtype=self.opts.dtype, device=self.opts.device,
                options={**O.audio_values(self.opts), "float_wav": self.folder.float_wav})
        except OSError as exc:
            raise CosycloneError(f"cannot hash the inputs: {exc}") from exc
        fps: dict[str, tuple[str, dict[str, str]]] = {}
        failed: list[RowRecord] = []
        for row in self.rows.rows:
            try:
                fps[row.id] = fingerprint.row_fingerprint(row, row_seed_of(self.opts.seed, row), ctx, hashes)
            except Exception as exc:  # a vanished or unreadable prompt, a field the hash cannot take
                failed.append(_failed_record(row, self.opts.seed, exc))
        hashes.save()
        ready = [r for r in self.rows.rows if r.id in fps]
        resume = runfolder.plan_resume(self.out, ready, fps, all_ids=[r.id for r in self.full.rows],
                                       overwrite=self.folder.overwrite)
        return _Prepared(ctx=ctx, fps=fps, failed=failed, resume=resume)

    # ------------------------------------------------------------------ running

    def run(self, progress: ProgressFactory | None = None) -> JobSummary:
        """Synthesize the rows to do into the folder and return the totals.

        Holds the folder's lock throughout (:class:`~cosyclone.lock.FolderBusy` when another
        writer has it). Raises :class:`~cosyclone.run.folder.OutputFolderError` when the folder cannot
        be written before any model loads; a write that fails later ends the run with the rows
        finished before kept (``JobSummary.write_error``). ``progress`` is called once with the
        number of rows to do and gets every finished row.
        """
        runfolder.check_writable(self.out)  # before any model loads
        with lock.FolderLock(self.out, self.tag, self.folder.command):
            return self._run_locked(progress)

    def _run_locked(self, progress: ProgressFactory | None) -> JobSummary:
        from .token_store import TokenStore
        from .writer import BackgroundWriter, WriterOptions

        removed = runfolder.remove_stale_temporaries(self.out)
        if removed:
            self.log(f"removed {len(removed)} temporary files left by a killed run")
        prep = self._prepare(fingerprint.HashCache())
        if prep.resume.describe():
            self.log(prep.resume.describe())
        todo = prep.resume.todo
        run_id = uuid.uuid4().hex[:12]
        if todo and self.folder.engine == "ray":
            self._ray = self.ray_plan()
            self._ray.check()  # an actor larger than a node's memory: refused before any model loads
        engine = self._local_engine(todo)
        # stage-0 checkpoint, owned by this run: a row that failed after the talker keeps its tokens
        tokens = TokenStore(runfolder.state_dir(self.out) / runfolder.TOKEN_DIR,
                            {rid: fp for rid, (fp, _) in prep.fps.items()})
        writer = BackgroundWriter(WriterOptions(out_dir=self.out, float_wav=self.folder.float_wav,
                                                sample_rate=self.cfg.hift.sampling_rate),
                                  runfolder.journal_path(self.out, self.tag))
        stamp = Stamper(self.rows.rows, prep.fps, run_id, writer.submit, manifest=self.manifest_label,
                        shard=self.folder.shard)
        sink = progress(len(todo) + len(prep.failed)) if progress is not None else None
        t_model = time.perf_counter()
        try:
            records, write_error = self._synthesize(engine, tokens, todo, prep.failed, stamp, sink)
        finally:  # also when the engine raised (a Ray run that lost rows): what was written is committed
            close_error = _close(writer)
        write_error = write_error or close_error
        wall = time.perf_counter() - t_model
        current, compact_error = self._compact()
        write_error = write_error or compact_error
        self._tidy_tokens(tokens, prep.fps, current)
        return self._summarize(prep, records, current, run_id=run_id, wall=wall, hits=tokens.hits,
                               write_error=write_error, written=writer.written)

    def _local_engine(self, todo: Sequence[ManifestRow]) -> Engine | None:
        """The loaded engine for the local run: the one given, else loaded now (None: Ray, or nothing to do)."""
        if not todo or self.folder.engine != "local":
            return None
        if self.engine is not None:
            return self.engine
        return Engine.load(self.model_dir, self.opts, cfg=self.cfg)

    def _synthesize(self, engine: Engine | None, tokens: Any, todo: Sequence[ManifestRow],
                    failed: Sequence[RowRecord], stamp: Stamper,
                    sink: ProgressSink | None) -> tuple[list[RowRecord], str | None]:
        """Run the engine over ``todo`` (after writing the rows that failed in preparation).

        Returns the records made (without audio) and the write error that ended the run, if any.
        """
        update = sink.update if sink is not None else None
        records: list[RowRecord] = []
        try:
            for rec in failed:
                stamp(rec)
                records.append(rec)
                if update is not None:
                    update(rec)
            if todo and self.folder.engine == "ray":
                from .ray_pool import run_ray

                records += run_ray(self.cfg, self.policy, todo, self.opts, stamp, progress=update,
                                   address=self.folder.ray_address, plan=self._ray, on_plan=self._ray_started,
                                   tokens=tokens)
            elif engine is not None:
                self._graph_errors = engine.graph_errors
                for rec in engine.run(todo, opts=self.opts, tokens=tokens):
                    stamp(rec)
                    records.append(RowRecord(row_id=rec.row_id, wav=None, diagnostics=rec.diagnostics))
                    if update is not None:
                        update(rec)
        except runfolder.OutputFolderError as exc:
            return records, str(exc)
        finally:
            if sink is not None:
                sink.close()
        return records, None

    def _ray_started(self, plan: Any) -> None:
        """The plan run_ray made on the live cluster (what runs.jsonl records), shown as it starts."""
        self._ray = plan
        for line in plan.describe():
            self.log(line)

    def _compact(self) -> tuple[dict[str, dict[str, Any]], str | None]:
        """The folder's current records after merging this writer's journal (and why that failed)."""
        try:
            return runfolder.compact(self.out, self.tag), None
        except runfolder.OutputFolderError as exc:
            return runfolder.read_records(self.out), str(exc)

    def _tidy_tokens(self, tokens: Any, fps: Mapping[str, tuple[str, dict[str, str]]],
                     current: Mapping[str, Mapping[str, Any]]) -> None:
        """Drop the stage-0 checkpoint of every row now written (and, for the whole manifest, strays)."""
        for rid, (fp, _) in fps.items():
            if current.get(rid, {}).get("status") == "ok" and current[rid].get("fingerprint") == fp:
                tokens.discard(rid)
        if self.tag == "all":  # other shards' rows are not in fps: only a whole-manifest run prunes
            tokens.prune()

    def _summarize(self, prep: _Prepared, records: Sequence[RowRecord], current: Mapping[str, Mapping[str, Any]],
                   *, run_id: str, wall: float, hits: int, write_error: str | None, written: int) -> JobSummary:
        """Totals of the folder and this run's figures, written to summary.json and runs.jsonl."""
        from . import report
        from .writer import write_summary

        made = [r.diagnostics for r in records]
        last_run = self._last_run(prep, made, run_id=run_id, wall=wall, hits=hits, write_error=write_error)
        totals = report.folder_totals(current.values())
        try:
            write_summary(self.out, {**totals, "out_dir": str(self.out), "last_run": last_run})
            runfolder.append_jsonl(self.out / runfolder.RUNS_NAME, last_run)
        except runfolder.OutputFolderError as exc:
            write_error = write_error or str(exc)
            last_run["write_error"] = write_error
        failed = [d for d in made if d.get("status") != "ok"]
        return JobSummary(totals=totals, last_run=last_run, failed=failed, write_error=write_error, written=written)

    def _last_run(self, prep: _Prepared, made: Sequence[Mapping[str, Any]], *, run_id: str, wall: float,
                  hits: int, write_error: str | None) -> dict[str, Any]:
        """This invocation's figures (summary.json ``last_run``, a line of runs.jsonl)."""
        resume, opts, policy = prep.resume, self.opts, self.policy
        audio = sum(float(d.get("audio_seconds") or 0.0) for d in made if d.get("status") == "ok")
        n_ok = sum(1 for d in made if d.get("status") == "ok")
        return {
            "run_id": run_id, "started_at": self.started_at, "finished_at": time.time(), "argv": sys.argv,
            "host": socket.gethostname(), "manifest": self.manifest_label, "shard": self.folder.shard,
            "rows_in_manifest": len(self.rows.rows), "invalid": len(self.rows.errors),
            "invalid_rows": [str(e) for e in self.rows.errors],
            "todo": len(resume.todo) + len(prep.failed), "done": n_ok, "failed": len(made) - n_ok,
            "skipped": len(resume.done), "redone": len(resume.redone), "redone_by": resume.redone_counts(),
            "retried": len(resume.retried), "not_written": len(resume.todo) + len(prep.failed) - len(made),
            "failed_rows": {d["id"]: d.get("error") for d in made if d.get("status") != "ok"},
            "rows_not_in_manifest": len(resume.foreign), "write_error": write_error,
            "talker_checkpoint_hits": hits,
            "audio_seconds": audio, "wall_seconds": wall, "total_wall_seconds": time.time() - self.started_at,
            "rows_per_s": len(made) / wall if wall > 0 and made else 0.0,
            "throughput_audio_s_per_s": audio / wall if wall > 0 else 0.0, "rtf": wall / audio if audio > 0 else None,
            "versions": versions(opts.text_frontend), "devices": devices(policy),
            "model_dir": str(self.model_dir) if self.model_dir else None, "model_hash": prep.ctx.model,
            "model_yaml_sha256": self.cfg.yaml_sha256 or None, "load_format": opts.load_format,
            "device": str(policy.device), "dtype": policy.dtype_name, "dtype_requested": policy.requested_dtype,
            "float_wav": self.folder.float_wav, "options": O.as_record(opts), "algorithm": fingerprint.ALGORITHM_VERSION,
            "engine": self.folder.engine, "ray": self._ray_record(),
            "cuda_graphs": graphs_record(opts.cuda_graphs, made, self._graph_errors),
        }

    def _ray_record(self) -> dict[str, Any] | None:
        """--ray-actors/--actor-threads as given and the plan the actors ran under (None: local engine)."""
        if self.folder.engine != "ray":
            return None
        return {"ray_actors": self.folder.ray_actors, "actor_threads": self.folder.actor_threads,
                "address": self.folder.ray_address, "plan": self._ray.as_record() if self._ray is not None else None}


def _close(writer: Any) -> str | None:
    """Close the writer (it commits every submitted row); why a write failed, if one did."""
    try:
        writer.close()
    except runfolder.OutputFolderError as exc:
        return str(exc)
    return None


def _failed_record(row: ManifestRow, run_seed: int, exc: BaseException) -> RowRecord:
    """A row that failed before any stage (its fingerprint raised), as the record the writer commits."""
    try:
        seed = row_seed_of(run_seed, row)
    except Exception:  # the seed derivation is what failed: report the row without one
        seed = -1
    return failed_record(row.id, row.line, seed, "prepare", exc)
