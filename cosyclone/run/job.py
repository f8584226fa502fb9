"""A synthesis run into an output folder: the one object ``cosyclone synth`` and
:meth:`cosyclone.api.CosyClone.synth_folder` share.

Split by responsibility: :class:`~cosyclone.run.plan.RunPlan` plans (manifest, options,
fingerprints, the resume per row), :class:`~cosyclone.run.drive.Driver` executes (rows from a
source, written and counted) and :mod:`cosyclone.run.account` accounts (``summary.json``,
``runs.jsonl``). This class holds the folder's side between them: the lock, the folder's index, the
writer, the stage-0 checkpoint, the run's end (:mod:`~cosyclone.folder.settle`), and the choice of row
source (this process or a Ray actor pool).

Must not: parse command lines or print (messages go to the ``log`` callable and the totals come
back as a :class:`~cosyclone.run.account.JobSummary`), wire stages, or touch a row's audio.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from cosyclone.base.device import DevicePolicy
from cosyclone.base.memory import read_peaks
from cosyclone.base.stop import StopRequest
from cosyclone.engine import Engine, RowResult
from cosyclone.errors import ManifestError
from cosyclone.folder import fingerprint, lock
from cosyclone.folder import layout as runfolder
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.row_record import RowRecord, RowStamp
from cosyclone.folder.settle import settle
from cosyclone.folder.token_store import TokenStore
from cosyclone.folder.writer import BackgroundWriter, WriterOptions
from cosyclone.manifest import Manifest, ManifestRow
from cosyclone.options import RunOptions
from cosyclone.run.account import JobSummary, RunFacts, RunTally, run_record, write_accounts
from cosyclone.run.drive import DriveEnd, Driver, LocalSource, RowSource
from cosyclone.run.job_types import JobPlan, Prepared, ProgressFactory, ProgressSink
from cosyclone.run.parts import ResumeTotals
from cosyclone.run.plan import RunPlan


class SynthJob:
    """Synthesize a manifest (or one shard of it) into an output folder, resumably.

    Build it with :meth:`open` (reads and validates the manifest and options; loads no model), look
    at :meth:`plan`, then :meth:`run`. ``engine`` is an already loaded
    :class:`~cosyclone.engine.Engine` to run the local rows on; without it :meth:`run` loads one
    when there is work (and never for Ray, whose actors load their own).
    """

    def __init__(self, planned: RunPlan, *, log: Callable[[str], None] | None = None,
                 engine: Engine | None = None) -> None:
        self.planned, self.engine = planned, engine
        self.log = log or (lambda msg: None)
        self.stop: StopRequest | None = None  # set by the caller that handles signals (cli synth, the API)
        self._ray_record: dict[str, Any] | None = None  # the Ray plan the run ran under (engine ray)

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
        planned = RunPlan.open(manifest, out, model_dir=model_dir, loaded=loaded, on_rejected=on_rejected,
                               plan_only=plan_only, **options)
        return cls(planned, log=log, engine=loaded)

    # what callers read of a job
    @property
    def out(self) -> Path:
        return self.planned.out

    @property
    def opts(self) -> RunOptions:
        return self.planned.opts

    @property
    def policy(self) -> DevicePolicy:
        return self.planned.policy

    @property
    def manifest_label(self) -> str:
        return self.planned.manifest_label

    def plan(self) -> JobPlan:
        """What :meth:`run` would do if started now (the folder is read, not locked or written)."""
        return self.planned.plan(self.log)

    # ------------------------------------------------------------------ running

    def run(self, progress: ProgressFactory | None = None) -> JobSummary:
        """Synthesize the rows to do into the folder and return the totals.

        Holds the folder's lock throughout (:class:`~cosyclone.folder.lock.FolderBusy` when another
        writer has it). Raises :class:`~cosyclone.folder.layout.OutputFolderError` when the folder cannot
        be written before any model loads; a write that fails later ends the run with the rows
        finished before kept (``JobSummary.write_error``). ``progress`` is called once with the
        number of rows to do and gets every finished row. A :attr:`stop` request ends it early with
        the accounts written (``last_run.stopped_by``).
        """
        p = self.planned
        runfolder.check_writable(p.out)  # before any model loads
        with lock.FolderLock(p.out, p.tag, p.folder.command):
            with runfolder.settle_lock(p.out):  # one writer at a time builds a stale index again
                index = runfolder.open_index(p.out)
            try:
                return self._run_locked(progress, index)
            finally:
                index.close()

    def _run_locked(self, progress: ProgressFactory | None, index: FolderIndex) -> JobSummary:
        p = self.planned
        removed = runfolder.remove_stale_temporaries(p.out)
        if removed:
            self.log(f"removed {len(removed)} temporary files left by a killed run")
        if index.rebuilt:
            self.log(f"indexed the folder's {index.count()} row records")
        hashes = fingerprint.HashCache()
        ctx = p.context(hashes)
        prepared = self._prepared(ctx, hashes, index)
        # stage-0 checkpoint, owned by this run: a row that failed after the talker keeps its tokens
        tokens = TokenStore(runfolder.state_dir(p.out) / runfolder.TOKEN_DIR, {})
        writer = BackgroundWriter(
            WriterOptions(out_dir=p.out, output=p.output, model_rate=p.cfg.hift.sampling_rate),
            runfolder.journal_path(p.out, p.tag),
            index=index,
            on_commit=lambda rec: tokens.committed(rec.id, rec.ok),  # an ok row's tokens go once it is down
            spool_metadata=True,
        )
        feed = _Feed(p, ctx, index, writer, tokens, run_id=uuid.uuid4().hex[:12])
        count = (
            p.lines() if p.streamed else sum(len(prep.resume.todo) + len(prep.failed) for _, prep in prepared)
        )
        feed.sink = progress(count) if progress is not None else None
        tally = RunTally()
        t_model = time.perf_counter()
        end, close_error, source = self._drive(prepared, feed, tally, writer, tokens)
        hashes.save()
        resume = p.finish_resume(feed.total, index)
        if p.streamed and resume.describe():
            self.log(resume.describe())
        wall = time.perf_counter() - t_model
        settle_error = self._settle(index, writer.touched, writer.meta_spool)
        write_error = end.write_error or close_error or settle_error
        self._tidy_tokens(tokens)
        record = run_record(
            self._facts(feed.run_id, ctx),
            resume,
            tally,
            prepared_failures=feed.failed_before,
            wall=wall,
            write_error=write_error,
            stopped_by=end.stopped_by,
            graph_errors=source.graph_errors,
            ray=self._ray_record,
            engine_facts=self.engine.facts().as_record() if self.engine is not None else None,
            peak_memory=read_peaks(p.policy.device).as_record(),
            written={rid for rid in resume.redone if rid in writer.written_ids},
        )
        return write_accounts(p.out, record, _kept_totals(index), write_error=write_error,
                              failed=tally.failed, written=writer.written,
                              rows_total=self._rows_total(end.stopped_by))

    def _prepared(self, ctx: fingerprint.RunContext, hashes: fingerprint.HashCache,
                  index: FolderIndex) -> Iterable[tuple[Manifest, Prepared]]:
        """The manifest's parts, each planned against the index as the driver reaches it (streamed), or
        every part planned first (read whole: the plan is told and counted before any row runs)."""
        p = self.planned
        prepared: Iterable[tuple[Manifest, Prepared]] = (
            (part, p.prepare(part.rows, ctx, hashes, index)) for part in p.parts())
        if p.streamed:  # the first part before this run's threads start: its normalizing pool may fork
            first = next(iter(prepared), None)
            return itertools.chain([first] if first is not None else [], prepared)
        whole = list(prepared)
        self._tell_resume([prep for _, prep in whole], index)
        return whole

    def _drive(self, prepared: Iterable[tuple[Manifest, Prepared]], feed: _Feed, tally: RunTally,
               writer: BackgroundWriter, tokens: TokenStore) -> tuple[DriveEnd, str | None, RowSource]:
        """The one driver loop over the parts; the writer closed and the source stopped whatever happens
        (also when the source raised: what was written is committed). Returns how it ended, the writer's
        closing error and the source."""
        p = self.planned
        driver = Driver(writer.submit, tally, feed.sink, feed.stamp)
        source = self._source(tokens)
        close_error: str | None = None
        try:
            end = driver.drive(prepared, source, batch_size=p.batch_size, token_budget=p.opts.token_budget,
                               stop=self.stop, on_part=feed.on_part)
        finally:
            try:
                source.close()  # a Ray pool's actors stop here, before the accounts
            finally:
                close_error = _close(writer)
                if feed.sink is not None:
                    feed.sink.close()
        return end, close_error, source

    def _rows_total(self, stopped_by: str | None) -> int:
        """The rows the end line counts against: the shard's valid rows, or, when a stop came before a
        streamed manifest was read to its end, its non-blank lines (reading on would outlast the grace)."""
        p = self.planned
        if p.streamed and stopped_by is not None:
            return p.lines() - len(p.rows.errors)
        return len(p.rows.rows)

    def _source(self, tokens: TokenStore) -> RowSource:
        """Where this run's rows are made: this process's engine, or a Ray actor pool."""
        p = self.planned
        if p.folder.engine == "ray":
            from cosyclone.ray.pool import RaySource

            return RaySource(p.cfg, p.policy, p.opts, p.folder, tokens, log=self.log, on_record=self._on_ray,
                             plan=p.ray_plan(), stop=self.stop)
        return LocalSource(self._load, p.opts, tokens, stop=self.stop)

    def _on_ray(self, record: dict[str, Any]) -> None:
        self._ray_record = record

    def _load(self) -> Engine:
        """The loaded engine for the local run: the one given, else loaded now (at the first row to do)."""
        if self.engine is None:
            p = self.planned
            self.engine = Engine.load(p.model_dir, p.opts, cfg=p.cfg)
        return self.engine

    def _facts(self, run_id: str, ctx: fingerprint.RunContext) -> RunFacts:
        from cosyclone.engine.setup import recorded_options

        p = self.planned
        return RunFacts(
            run_id=run_id,
            started_at=p.started_at,
            manifest=p.manifest_label,
            shard=p.folder.shard,
            rows_in_manifest=len(p.rows.rows),
            invalid_rows=tuple(str(e) for e in p.rows.errors),
            model_dir=str(p.model_dir) if p.model_dir else None,
            model_hash=ctx.model,
            model_yaml_sha256=p.cfg.yaml_sha256 or None,
            load_format=p.opts.load_format,
            device=str(p.policy.device),
            backend=p.policy.backend,
            dtype=p.policy.dtype_name,
            dtype_requested=p.policy.requested_dtype,
            options=recorded_options(p.opts, p.cfg),
            output=p.output.as_record(),
            stage_dtypes=p.policy.stage_dtypes,
            text_frontend=p.opts.text_frontend,
            engine=p.folder.engine,
            llm=p.provenance.llm,
            provenance=p.provenance.as_record(),
            graphs_resolved=p.opts.cuda_graphs,
        )

    def _tell_resume(self, preps: Iterable[Prepared], index: FolderIndex) -> None:
        """Log what the resume plan of a manifest read whole says, before any row runs."""
        plan = ResumeTotals()
        for prep in preps:
            plan.add(prep.resume)
        said = self.planned.finish_resume(plan, index).describe()
        if said:
            self.log(said)

    def _settle(self, index: FolderIndex, touched: Iterable[str], spool: Path) -> str | None:
        """This writer's journal appended to the records and the metadata written (why that failed)."""
        try:
            settle(self.planned.out, self.planned.tag, index=index, touched=touched, spool=spool)
        except runfolder.OutputFolderError as exc:
            return str(exc)
        return None

    def _tidy_tokens(self, tokens: TokenStore) -> None:
        """The stage-0 checkpoint settled: each ok row's segments went as its record went down (known
        names, O(rows)); a whole-manifest run also drops strays, in one listing; the removals are waited
        for."""
        if self.planned.tag == "all":  # other shards' rows are not in this run: only a whole run prunes
            tokens.prune()
        tokens.close()


class _Feed:
    """What the driver's parts leave with the run as they come: the resume totals, the failures before
    any stage, and the rows fed and not yet stamped (an entry goes as its result comes: bounded by what
    is in flight)."""

    def __init__(self, planned: RunPlan, ctx: fingerprint.RunContext, index: FolderIndex,
                 writer: BackgroundWriter, tokens: TokenStore, *, run_id: str) -> None:
        self.planned, self.ctx, self.index, self.writer, self.tokens = planned, ctx, index, writer, tokens
        self.run_id = run_id  # this invocation's id (its line of runs.jsonl)
        self.total = ResumeTotals()  # the parts' resume, summed
        self.failed_before = 0  # rows failed before any stage (their prompt could not be read, ...)
        self.fps: dict[str, tuple[str, dict[str, str]]] = {}  # fed row id -> its fingerprint and parts
        self.rows: dict[str, ManifestRow] = {}  # fed row id -> its manifest row
        self.sink: ProgressSink | None = None  # the progress (set once the rows are counted)

    def on_part(self, part: Manifest, prep: Prepared) -> None:
        """A part reaches the driver: its resume counted, its done rows' meta restamped, its fed rows kept
        until stamped, the token checkpoint told which rows it keeps."""
        self.total.add(prep.resume)
        self.failed_before += len(prep.failed)
        by_id = {r.id: r for r in part.rows}
        _restamp_meta(self.index, self.writer, prep.resume.done, by_id)
        exclude = getattr(self.sink, "exclude", None)  # a caller's own sink (the API's) may not take it
        if self.planned.streamed and exclude is not None:  # counted from the lines: not these
            exclude(len(part.errors) + len(prep.resume.done))
        fed = [r.id for r in prep.resume.todo] + [r.id for r in prep.failed]
        self.fps.update((rid, prep.fps[rid]) for rid in fed if rid in prep.fps)
        self.rows.update((rid, by_id[rid]) for rid in fed)
        self.tokens.add_keys({r.id: fingerprint.token_key(prep.fps[r.id][1]) for r in prep.resume.todo})
        self.tokens.discard_done({rid: fingerprint.token_key(prep.fps[rid][1]) for rid in prep.resume.done})

    def stamp(self, result: RowResult) -> RowStamp:
        p = self.planned
        return _stamp(self.rows.pop(result.id), self.fps.pop(result.id, None), self.run_id, p.manifest_label,
                      p.folder.shard, self.ctx)


def _stamp(row: ManifestRow, fp: tuple[str, dict[str, str]] | None, run_id: str, manifest: str,
           shard: str | None, ctx: fingerprint.RunContext) -> RowStamp:
    """What made a row: its manifest fields, its fingerprint (None: it failed before one), the run and
    where the row ran (``ctx``'s device and threads)."""
    return RowStamp(
        fingerprint=fp[0] if fp else None,
        fingerprint_parts=fp[1] if fp else None,
        run_id=run_id,
        text=row.text,
        prompt_text=row.prompt_text,
        prompt_audio=str(row.prompt_audio),
        mode=row.mode,
        instruct=row.instruct,
        speed=row.speed,
        manifest=manifest,
        shard=shard,
        meta=row.meta,
        device=ctx.device,
        threads=ctx.threads,
        llm=ctx.llm,
    )


def _restamp_meta(index: FolderIndex, writer: BackgroundWriter, done: Iterable[str],
                  rows: Mapping[str, ManifestRow]) -> None:
    """Meta never redoes a row: a done row whose manifest ``meta`` changed has its record committed
    again with the new one (its file untouched)."""
    for found in index.get_many(done):
        line = index.record(found)
        rec = RowRecord.from_json(line) if line is not None else None
        row = rows[found.id]
        if rec is not None and rec.meta != row.meta:
            writer.restamp(replace(rec, meta=row.meta, finished_at=time.time()))


def _kept_totals(index: FolderIndex) -> dict[str, int]:
    """The folder totals the index keeps; a folder whose index cannot be read is a folder error."""
    try:
        return index.totals()
    except sqlite3.Error as exc:
        raise runfolder.OutputFolderError(f"cannot read {index.path}: {exc}") from exc


def _close(writer: BackgroundWriter) -> str | None:
    """Close the writer (it commits every submitted row); why a write failed, if one did."""
    try:
        writer.close()
    except runfolder.OutputFolderError as exc:
        return str(exc)
    return None
