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

import itertools
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cosyclone import options as O
from cosyclone.base.shard import Shard
from cosyclone.engine import Engine, RowRecord, model_config, resolve_options
from cosyclone.engine.outcome import failed_record
from cosyclone.engine.stages import row_seed_of
from cosyclone.errors import CosycloneError, ManifestError
from cosyclone.manifest import Manifest, ManifestRow, iter_manifest
from cosyclone.manifest import stream as manifest_stream
from cosyclone.options import FolderOptions, RunOptions
from cosyclone.run import fingerprint, lock
from cosyclone.run import folder as runfolder
from cosyclone.run.job_types import (
    JobPlan,
    JobSummary,
    Prepared,
    ProgressFactory,
    ProgressSink,
)
from cosyclone.run.parts import ResumeTotals, plan_parts, split_parts
from cosyclone.run.record import Stamper, summarize


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
                 manifest_label: str | None = None, started_at: float | None = None,
                 stream: Iterator[Manifest] | None = None,
                 on_rejected: Callable[[ManifestError], None] | None = None) -> None:
        # ``stream``: the manifest's parts still to be read (``manifest`` fills as they are); None: read whole
        self._stream = stream
        self.streamed = stream is not None
        self.full = manifest  # every row: another shard's rows are not "foreign" to the folder
        self.rows = manifest.shard(Shard.parse(folder.shard)) if folder.shard else manifest  # this shard's
        self.on_rejected = on_rejected or (lambda err: None)  # each rejected line, as it is found
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
             log: Callable[[str], None] | None = None, loaded: Engine | None = None,
             on_rejected: Callable[[ManifestError], None] | None = None, plan_only: bool = False,
             **options: Any) -> SynthJob:
        """Read ``manifest``, check the options and resolve device, dtype and model configuration.

        ``options`` are :mod:`cosyclone.options` fields, run and folder alike (``seed``,
        ``batch_size``, ``top_k``, ``shard``, ``engine``, ...). ``loaded``: an already loaded
        :class:`~cosyclone.engine.Engine` to run on (its model options win; the API passes its own).
        Raises :class:`CosycloneError` for anything a user must fix first: an unreadable manifest,
        an option out of range, a model directory that does not load as configuration, Ray missing
        for ``engine="ray"``. A whole-manifest local run reads the manifest as it runs (its first
        rows start while later lines are still validated); a shard or a Ray run reads it first.
        ``on_rejected`` hears of each rejected line as it is found. ``plan_only``: the job is opened
        for :meth:`plan` alone (``--dry-run``), so texts are normalized only where validation needs it
        (no frontend reads them next); :meth:`run` still works, its frontend normalizing then.
        """
        started = time.time()
        opts, folder = O.split(options)  # checked before devices are resolved or the model read
        if loaded is not None:
            opts = replace(opts, **{k: getattr(loaded.opts, k) for k in O.MODEL_FIELDS})
        full, stream = iter_manifest(manifest, text_frontend=opts.text_frontend, normalize_all=not plan_only)
        if folder.shard or folder.engine != "local":
            for _ in stream:  # a shard's lines need the line count; Ray plans the whole run at once
                pass
            stream = None
        opts, policy = resolve_options(opts)
        if loaded is not None:
            policy = loaded.policy  # as the model was loaded (what was requested included)
        cfg = loaded.cfg if loaded is not None else model_config(model_dir, opts.load_format)
        if folder.engine == "ray":
            from cosyclone.run.ray_cluster import require_ray

            require_ray()  # before any work: say how to install it
        if not folder.command:
            folder = replace(folder, command=" ".join(sys.argv))
        return cls(full, Path(out), opts, cfg=cfg, policy=policy,
                   model_dir=Path(model_dir) if model_dir is not None else None, folder=folder, log=log,
                   engine=loaded, manifest_label=str(manifest), started_at=started, stream=stream,
                   on_rejected=on_rejected)

    # ------------------------------------------------------------------ planning

    def plan(self) -> JobPlan:
        """What :meth:`run` would do if started now (the folder is read, not locked or written)."""
        runfolder.check_writable(self.out)
        hashes = fingerprint.HashCache()
        ctx, existing = self._context(hashes), runfolder.read_records(self.out)
        total, failed, todo_parts = ResumeTotals(), 0, []
        for part in self._parts():
            prep = self._prepare(part.rows, ctx, hashes, existing)
            total.add(prep.resume)
            failed += len(prep.failed)
            todo_parts.append(prep.resume.todo)
        hashes.save()
        resume = self._finish_resume(total, existing)
        if resume.describe():
            self.log(resume.describe())
        ray = self.ray_plan() if self.folder.engine == "ray" else None
        batches = plan_parts(todo_parts, self.opts.batch_size, self.opts.token_budget)
        return JobPlan(valid_rows=len(self.rows.rows), rejected=len(self.rows.errors), done=len(resume.done),
                       todo=len(resume.todo), unprepared=failed, batches=len(batches),
                       resume=resume.describe(), device=str(self.policy.device), dtype=self.policy.dtype_name,
                       engine=self.folder.engine, engine_lines=tuple(ray.describe()) if ray else (),
                       refusal=ray.refusal if ray else None)

    def ray_plan(self) -> Any:
        """The Ray actors this run would get on the cluster as it is now (:func:`cosyclone.run.ray_cluster.plan_cluster`:
        ``--ray-actors``/``--actor-threads`` or the sizing rule, the measured footprint, each node's shape)."""
        from cosyclone.run.ray_cluster import plan_cluster

        return plan_cluster(self.cfg, self.policy, self.opts.batch_size, address=self.folder.ray_address,
                            actors=self.folder.ray_actors, threads=self.folder.actor_threads)

    def _parts(self) -> Iterator[Manifest]:
        """This run's rows part by part (:mod:`.parts`): a streamed manifest's chunks as they are
        validated, else the manifest read whole, cut the same way. Rejected lines are told as found."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            parts: Iterator[Manifest] = stream
        else:
            parts = split_parts(self.rows, manifest_stream.CHUNK_LINES)
        for part in parts:
            for err in part.errors:
                self.on_rejected(err)
            yield part

    def _context(self, hashes: fingerprint.HashCache) -> fingerprint.RunContext:
        """The run-wide fingerprint parts (an unreadable model directory stops the run, as unusable input)."""
        try:
            return fingerprint.RunContext(
                model=fingerprint.model_content_hash(self.model_dir, hashes,
                                                   dummy_tag="released" if self.opts.load_format == "dummy" else ""),
                dtype=self.opts.dtype, device=self.opts.device,
                options={**O.audio_values(self.opts), "float_wav": self.folder.float_wav})
        except OSError as exc:
            raise CosycloneError(f"cannot hash the inputs: {exc}") from exc

    def _prepare(self, rows: Sequence[ManifestRow], ctx: fingerprint.RunContext, hashes: fingerprint.HashCache,
                 existing: Mapping[str, Mapping[str, Any]]) -> Prepared:
        """Fingerprint ``rows`` and plan their resume against the folder's ``existing`` records.

        A row's own hash (its prompt's content, its text) is the row's: a row whose fingerprint
        raises becomes a failed record and the others go on.
        """
        fps: dict[str, tuple[str, dict[str, str]]] = {}
        failed: list[RowRecord] = []
        for row in rows:
            try:
                fps[row.id] = fingerprint.row_fingerprint(row, row_seed_of(self.opts.seed, row), ctx, hashes)
            except Exception as exc:  # a vanished or unreadable prompt, a field the hash cannot take
                failed.append(_failed_record(row, self.opts.seed, exc))
        ready = [r for r in rows if r.id in fps]
        resume = runfolder.plan_resume(self.out, ready, fps, all_ids=(), overwrite=self.folder.overwrite,
                                       records=existing)
        return Prepared(ctx=ctx, fps=fps, failed=failed, resume=resume)

    def _finish_resume(self, total: ResumeTotals, existing: Mapping[str, Any]) -> runfolder.ResumePlan:
        """The run's resume plan once every part is in: with the folder's rows this manifest lacks."""
        total.plan.foreign = sorted(set(existing) - {r.id for r in self.full.rows})
        return total.plan

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
        from cosyclone.run.token_store import TokenStore
        from cosyclone.run.writer import BackgroundWriter, WriterOptions

        removed = runfolder.remove_stale_temporaries(self.out)
        if removed:
            self.log(f"removed {len(removed)} temporary files left by a killed run")
        hashes = fingerprint.HashCache()
        ctx, existing = self._context(hashes), runfolder.read_records(self.out)
        prepared: Iterable[tuple[Manifest, Prepared]] = (
            (part, self._prepare(part.rows, ctx, hashes, existing)) for part in self._parts())
        if self.streamed:  # the first part before this run's threads start: its normalizing pool may fork
            first = next(iter(prepared), None)
            prepared = itertools.chain([first] if first is not None else [], prepared)
        run_id = uuid.uuid4().hex[:12]
        # stage-0 checkpoint, owned by this run: a row that failed after the talker keeps its tokens
        tokens = TokenStore(runfolder.state_dir(self.out) / runfolder.TOKEN_DIR, {})
        writer = BackgroundWriter(WriterOptions(out_dir=self.out, float_wav=self.folder.float_wav,
                                                sample_rate=self.cfg.hift.sampling_rate),
                                  runfolder.journal_path(self.out, self.tag))
        stamp = Stamper([], {}, run_id, writer.submit, manifest=self.manifest_label, shard=self.folder.shard)
        total, fps, failed = ResumeTotals(), {}, []
        records: list[RowRecord] = []
        write_error: str | None = None
        ray_parts: list[list[ManifestRow]] = []
        if self.streamed:  # the manifest's lines bound the rows to do; the resume plan is told at the end
            sink = progress(self._lines()) if progress is not None else None
        else:  # read whole: every part prepared first, so the plan is told and counted before any row runs
            prepared = list(prepared)
            self._tell_resume([prep for _, prep in prepared], existing)
            n = sum(len(prep.resume.todo) + len(prep.failed) for _, prep in prepared)
            sink = progress(n) if progress is not None else None
        t_model = time.perf_counter()
        try:
            for part, prep in prepared:
                total.add(prep.resume)
                fps.update(prep.fps)
                failed += prep.failed
                tokens.keys.update({rid: fp for rid, (fp, _) in prep.fps.items()})
                stamp.add(part.rows, prep.fps)
                if self.folder.engine == "ray":  # Ray plans the whole run at once, in the same parts
                    ray_parts.append(prep.resume.todo)
                    records += self._write_failed(prep.failed, stamp, sink)
                    continue
                made, write_error = self._synthesize(self._local_engine(prep.resume.todo), tokens,
                                                     prep.resume.todo, prep.failed, stamp, sink)
                records += made
                if write_error:
                    break
            if self.folder.engine == "ray" and not write_error:
                made, write_error = self._synthesize_ray(ray_parts, tokens, stamp, sink)
                records += made
        finally:  # also when the engine raised (a Ray run that lost rows): what was written is committed
            close_error = _close(writer)
            if sink is not None:
                sink.close()
        hashes.save()
        resume = self._finish_resume(total, existing)
        if self.streamed and resume.describe():
            self.log(resume.describe())
        write_error = write_error or close_error
        wall = time.perf_counter() - t_model
        current, compact_error = self._compact()
        write_error = write_error or compact_error
        self._tidy_tokens(tokens, fps, current)
        prep = Prepared(ctx=ctx, fps=fps, failed=failed, resume=resume)
        return summarize(self, prep, records, current, run_id=run_id, wall=wall, hits=tokens.hits,
                         write_error=write_error, written=writer.written)

    def _tell_resume(self, preps: Sequence[Prepared], existing: Mapping[str, Any]) -> None:
        """Log what the resume plan of a manifest read whole says, before any row runs."""
        plan = ResumeTotals()
        for prep in preps:
            plan.add(prep.resume)
        said = self._finish_resume(plan, existing).describe()
        if said:
            self.log(said)

    def _lines(self) -> int:
        """The manifest's non-blank lines: what a streamed run's progress counts against."""
        from cosyclone.manifest.stream import iter_lines

        return sum(1 for _ in iter_lines(self.full.path))

    def _local_engine(self, todo: Sequence[ManifestRow]) -> Engine | None:
        """The loaded engine for the local run: the one given, else loaded now (None: Ray, or nothing to do)."""
        if not todo or self.folder.engine != "local":
            return None
        if self.engine is None:
            self.engine = Engine.load(self.model_dir, self.opts, cfg=self.cfg)  # once, at the first row to do
        return self.engine

    def _write_failed(self, failed: Sequence[RowRecord], stamp: Stamper, sink: ProgressSink | None) -> list[RowRecord]:
        """The rows that failed in preparation, written as their records."""
        for rec in failed:
            stamp(rec)
            if sink is not None:
                sink.update(rec)
        return list(failed)

    def _synthesize(self, engine: Engine | None, tokens: Any, todo: Sequence[ManifestRow],
                    failed: Sequence[RowRecord], stamp: Stamper,
                    sink: ProgressSink | None) -> tuple[list[RowRecord], str | None]:
        """One part on the local engine (after writing its rows that failed in preparation).

        Returns the records made (without audio) and the write error that ended the run, if any.
        """
        update = sink.update if sink is not None else None
        records: list[RowRecord] = []
        try:
            records += self._write_failed(failed, stamp, sink)
            if engine is not None and todo:
                self._graph_errors = engine.graph_errors
                for rec in engine.run(todo, opts=self.opts, tokens=tokens):
                    stamp(rec)
                    records.append(RowRecord(row_id=rec.row_id, wav=None, diagnostics=rec.diagnostics))
                    if update is not None:
                        update(rec)
        except runfolder.OutputFolderError as exc:
            return records, str(exc)
        return records, None

    def _synthesize_ray(self, parts: Sequence[Sequence[ManifestRow]], tokens: Any, stamp: Stamper,
                        sink: ProgressSink | None) -> tuple[list[RowRecord], str | None]:
        """Every part's rows on the Ray actor pool, batched exactly as the local engine batches them."""
        todo = [row for part in parts for row in part]
        if not todo:
            return [], None
        from cosyclone.run.ray_pool import run_ray

        self._ray = self.ray_plan()
        self._ray.check()  # an actor larger than a node's memory: refused before any model loads
        batches = plan_parts(parts, self.opts.batch_size, self.opts.token_budget)
        try:
            return run_ray(self.cfg, self.policy, todo, self.opts, stamp,
                           progress=sink.update if sink is not None else None, address=self.folder.ray_address,
                           plan=self._ray, on_plan=self._ray_started, tokens=tokens, batches=batches), None
        except runfolder.OutputFolderError as exc:
            return [], str(exc)

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
