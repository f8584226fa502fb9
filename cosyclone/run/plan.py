"""A run's plan: the manifest and options read, fingerprints made, and the resume decided per row.

Why its own object: planning is what ``--dry-run`` does alone and what a run does first, part by
part, under the lock. It reads the manifest (streamed or whole), the folder's index (its own rows
looked up) and the inputs' content hashes; it loads no model and writes nothing but the hash cache
and the index (built from the records when missing or stale). A row whose fingerprint cannot be
made (its prompt vanished) becomes a failed result here and the others go on.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cosyclone.base.device import DevicePolicy
from cosyclone.base.shard import Shard
from cosyclone.engine import Engine, RowResult, model_config, resolve_options
from cosyclone.engine.outcome import failed_result
from cosyclone.engine.stages import row_seed_of
from cosyclone.errors import CosycloneError, ManifestError
from cosyclone.folder import fingerprint, provenance
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.folder.index import FolderIndex
from cosyclone.folder.provenance import Provenance
from cosyclone.manifest import Manifest, ManifestRow, iter_manifest
from cosyclone.manifest import stream as manifest_stream
from cosyclone.model.config import ModelConfig
from cosyclone.options import MODEL_FIELDS, FolderOptions, RunOptions, audio_values, check, split
from cosyclone.run.job_types import JobPlan, Prepared
from cosyclone.run.parts import ResumeTotals, plan_parts, split_parts
from cosyclone.run.resume import ResumePlan, plan_resume


def _provenance(cfg: ModelConfig, opts: RunOptions, folder: FolderOptions) -> Provenance:
    """The run's :class:`~cosyclone.folder.provenance.Provenance` (the model files hashed through the shared
    cache: once per file, not per run); an unreadable model file stops the run."""
    hashes = fingerprint.HashCache()
    try:
        found = provenance.of_model(cfg, opts, hashes, tagged=not folder.no_provenance_tag)
    except OSError as exc:
        raise CosycloneError(f"cannot hash the model files: {exc}") from exc
    hashes.save()
    return found


class RunPlan:
    """A manifest (or one shard of it) against an output folder, under resolved options."""

    def __init__(
        self,
        manifest: Manifest,
        out: Path,
        opts: RunOptions,
        *,
        cfg: ModelConfig,
        policy: DevicePolicy,
        model_dir: Path | None,
        folder: FolderOptions = FolderOptions(),
        manifest_label: str | None = None,
        started_at: float | None = None,
        stream: Iterator[Manifest] | None = None,
        on_rejected: Callable[[ManifestError], None] | None = None,
    ) -> None:
        # the manifest's parts still to be read (``manifest`` fills as they are); None: whole
        self._stream = stream
        self.streamed = stream is not None
        self.full = manifest  # every row: another shard's rows are not "foreign" to the folder
        self.rows = manifest.shard(Shard.parse(folder.shard)) if folder.shard else manifest  # this shard's
        self.on_rejected = on_rejected or (lambda err: None)  # each rejected line, as it is found
        self.out, self.opts, self.cfg, self.policy, self.model_dir = Path(out), opts, cfg, policy, model_dir
        self.folder = folder
        # what made the audio (model files, talker, version), its statement tagged into every file
        self.provenance = _provenance(cfg, opts, folder)
        # the files' rate, format, encoding, trimming and tag
        self.output = AudioOutput.of(folder, self.provenance.statement())
        self.manifest_label = manifest_label if manifest_label is not None else str(manifest.path)
        self.tag = runfolder.shard_tag(folder.shard)
        self.started_at = time.time() if started_at is None else started_at
        self._ray_plan: Any = None
        check(opts, folder)

    @classmethod
    def open(cls, manifest: str | Path, out: str | Path, *, model_dir: str | Path | None = None,
             loaded: Engine | None = None, on_rejected: Callable[[ManifestError], None] | None = None,
             plan_only: bool = False, **options: Any) -> RunPlan:
        """Read ``manifest``, check the options, resolve device, dtype and model configuration.

        See :meth:`cosyclone.run.job.SynthJob.open`, which this serves.
        """
        started = time.time()
        opts, folder = split(options)  # checked before devices are resolved or the model read
        if loaded is not None:
            opts = replace(opts, **{k: getattr(loaded.opts, k) for k in MODEL_FIELDS})
        full, stream = iter_manifest(manifest, text_frontend=opts.text_frontend, normalize_all=not plan_only)
        stream_or_none: Iterator[Manifest] | None = stream
        if folder.shard or folder.engine != "local":
            for _ in stream:  # a shard's lines need the line count; Ray plans the whole run at once
                pass
            stream_or_none = None
        opts, policy = resolve_options(opts)
        if loaded is not None:
            policy = loaded.policy  # as the model was loaded (what was requested included)
        cfg = loaded.cfg if loaded is not None else model_config(model_dir, opts.load_format)
        if opts.load_format != "dummy" and cfg.model_dir is not None:
            cfg.talker_file(opts.llm)  # a missing --llm file stops the run before any work
        if folder.engine == "ray":
            from cosyclone.ray.cluster import require_ray

            require_ray()  # before any work: say how to install it
        if not folder.command:
            folder = replace(folder, command=" ".join(sys.argv))
        return cls(
            full,
            Path(out),
            opts,
            cfg=cfg,
            policy=policy,
            model_dir=Path(model_dir) if model_dir is not None else None,
            folder=folder,
            manifest_label=str(manifest),
            started_at=started,
            stream=stream_or_none,
            on_rejected=on_rejected,
        )

    # ------------------------------------------------------------------ the plan

    def plan(self, log: Callable[[str], None]) -> JobPlan:
        """What a run would do if started now (the folder is read, not locked or written)."""
        runfolder.check_creatable(self.out)  # a plan writes nothing, not even the folder
        hashes = fingerprint.HashCache()
        aside: tempfile.TemporaryDirectory[str] | None = None
        if self.out.exists():
            with runfolder.settle_lock(self.out):
                index = runfolder.open_index(self.out)
        else:  # no records to read: an empty index aside, so that the folder is not made
            aside = tempfile.TemporaryDirectory(prefix="cosyclone-plan-")
            index = FolderIndex(Path(aside.name), [], state=".")
        try:
            ctx = self.context(hashes)
            total, failed, todo_parts = ResumeTotals(), 0, []
            for part in self.parts():
                prep = self.prepare(part.rows, ctx, hashes, index)
                total.add(prep.resume)
                failed += len(prep.failed)
                todo_parts.append(prep.resume.todo)
            hashes.save()
            resume = self.finish_resume(total, index)
        finally:
            index.close()
            if aside is not None:
                aside.cleanup()
        if resume.describe():
            log(resume.describe())
        ray = self.ray_plan() if self.folder.engine == "ray" else None
        batches = plan_parts(todo_parts, self.batch_size, self.opts.token_budget)
        if ray is not None:
            engine_lines = tuple(ray.describe())
        else:  # what this machine's engine would run at (on a GPU: from the memory free now)
            from cosyclone.engine.sizing import dry_run_sizing

            sizing = dry_run_sizing(self.cfg, self.policy, self.opts)
            engine_lines = (*sizing.describe(), _projection(sizing, [r for part in todo_parts for r in part]))
        return JobPlan(valid_rows=len(self.rows.rows), rejected=len(self.rows.errors), done=len(resume.done),
                       todo=len(resume.todo), unprepared=failed, batches=len(batches),
                       resume=resume.describe(), device=str(self.policy.device), dtype=self.policy.dtype_name,
                       engine=self.folder.engine, engine_lines=engine_lines,
                       refusal=ray.refusal if ray else None)

    def ray_plan(self) -> Any:
        """The Ray actors this run would get on the cluster as it is now
        (:func:`cosyclone.ray.cluster.plan_cluster`),
        read once per job."""
        if self._ray_plan is None:
            from cosyclone.ray.cluster import plan_cluster

            self._ray_plan = plan_cluster(self.cfg, self.policy, self.batch_size,
                                          address=self.folder.ray_address, actors=self.folder.ray_actors,
                                          threads=self.folder.actor_threads)
        return self._ray_plan

    @property
    def batch_size(self) -> int:
        """Rows per batch as resolved (``resolve_options`` always sets it: 8 on CPU, sized on a GPU)."""
        assert self.opts.batch_size is not None
        return self.opts.batch_size

    def actor_threads(self) -> int | None:
        """The torch threads each Ray actor runs with (None: a local run, this process's count)."""
        if self.folder.engine != "ray" or self.policy.device.type != "cpu":
            return None
        return self.folder.actor_threads or self.ray_plan().threads

    def parts(self) -> Iterator[Manifest]:
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

    def context(self, hashes: fingerprint.HashCache) -> fingerprint.RunContext:
        """The run-wide fingerprint parts (an unreadable model directory stops the run, as unusable input)."""
        try:
            return fingerprint.RunContext(
                model=fingerprint.model_content_hash(
                    self.model_dir, hashes, dummy_tag="released" if self.opts.load_format == "dummy" else ""
                ),
                dtype=self.opts.dtype,
                device=self.policy.backend,
                threads=fingerprint.cpu_threads(self.policy, self.actor_threads()),
                options={**audio_values(self.opts), **self.output.fingerprint_values()},
                llm=self.provenance.llm,
            )
        except OSError as exc:
            raise CosycloneError(f"cannot hash the inputs: {exc}") from exc

    def prepare(self, rows: Sequence[ManifestRow], ctx: fingerprint.RunContext, hashes: fingerprint.HashCache,
                index: FolderIndex) -> Prepared:
        """Fingerprint ``rows`` and plan their resume against the folder's ``index`` (these rows only).

        A row's own hash (its prompt's content, its text) is the row's: a row whose fingerprint
        raises becomes a failed result and the others go on.
        """
        fps: dict[str, tuple[str, dict[str, str]]] = {}
        failed: list[RowResult] = []
        for row in rows:
            try:
                fps[row.id] = fingerprint.row_fingerprint(row, row_seed_of(self.opts.seed, row), ctx, hashes)
            except Exception as exc:  # a vanished or unreadable prompt, a field the hash cannot take
                failed.append(_failed_result(row, self.opts.seed, exc, int(self.cfg.hift.sampling_rate)))
        ready = [r for r in rows if r.id in fps]
        resume = plan_resume(self.out, ready, fps, overwrite=self.folder.overwrite, index=index)
        return Prepared(ctx=ctx, fps=fps, failed=failed, resume=resume)

    def finish_resume(self, total: ResumeTotals, index: FolderIndex) -> ResumePlan:
        """The run's resume plan once every part is in: with the count of the folder's rows this
        manifest lacks (every manifest row looked up, another shard's included)."""
        total.plan.foreign = index.count() - index.count_present(r.id for r in self.full.rows)
        return total.plan

    def lines(self) -> int:
        """The manifest's non-blank lines: what a streamed run's progress counts against."""
        from cosyclone.manifest.stream import iter_lines

        return sum(1 for _ in iter_lines(self.full.path))


def _failed_result(row: ManifestRow, run_seed: int, exc: BaseException, sample_rate: int) -> RowResult:
    """A row that failed before any stage (its fingerprint raised), as the result the writer commits."""
    try:
        seed = row_seed_of(run_seed, row)
    except Exception:  # the seed derivation is what failed: report the row without one
        seed = -1
    return failed_result(row.id, row.line, seed, "prepare", exc, sample_rate=sample_rate)


#: The audio seconds a row is assumed to make when a dry run projects the run (its texts are not decoded yet).
PROJECTED_ROW_SECONDS = 10.0


def _projection(sizing: Any, rows: Sequence[ManifestRow]) -> str:
    """The dry run's projection line: rows per second and the bounding stage from the device's cost
    table (:mod:`cosyclone.engine.projection`; estimates, said so there)."""
    from cosyclone.engine.projection import CPU, H100, project

    distinct = len({str(r.prompt_audio) for r in rows}) / len(rows) if rows else 1.0
    p = project(CPU if sizing.device == "cpu" else H100, rows=len(rows), row_seconds=PROJECTED_ROW_SECONDS,
                slots=sizing.talker_slots or sizing.batch_size, prompt_workers=sizing.frontend_workers,
                distinct_prompts=distinct)
    return f"  {p.describe()} (rows of {PROJECTED_ROW_SECONDS:g} s assumed, {distinct:.0%} distinct prompts)"

