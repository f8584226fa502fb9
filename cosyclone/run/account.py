"""A run's accounts: what each invocation did (``runs.jsonl``, ``summary.json``'s ``last_run``).

Why a typed record: a night's log is read by scripts (rows done, the device, peak memory, why it
stopped), so :class:`RunRecord` is a frozen dataclass with a comment per field, built in one place
(:func:`run_record`) and serialized in one place (:meth:`RunRecord.to_json`); docs/output.md's
table of it is generated from those comments. The figures come from a :class:`RunTally` kept as
rows finish, so a million-row run holds counts, not records.
"""

from __future__ import annotations

import platform
import socket
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cosyclone.engine import RowResult
from cosyclone.errors import Exit
from cosyclone.folder import layout as runfolder
from cosyclone.folder import totals as report
from cosyclone.folder.version import FOLDER_FORMAT
from cosyclone.options import LoadFormat, TextFrontendName
from cosyclone.run.resume import ResumePlan


@dataclass
class RunTally:
    """This invocation's rows as they finish: counts and the failed rows (the only rows kept)."""

    done: int = 0  # rows written ok
    failed: list[RowResult] = field(default_factory=list)
    # rows written failed, without audio, in arrival order
    audio_seconds: float = 0.0  # audio of the ok rows
    graph_rows: int = 0  # rows with at least one decode step replayed as a CUDA graph
    graph_steps: int = 0  # decode steps replayed as CUDA graphs
    hits: int = 0  # segments whose talker result came from the stage-0 checkpoint

    def add(self, result: RowResult) -> None:
        if result.ok:
            self.done += 1
            self.audio_seconds += result.audio_seconds
        else:
            self.failed.append(result.without_audio())
        steps = sum(s.graph_steps for s in result.sampler)
        self.graph_steps += steps
        self.graph_rows += 1 if steps else 0

    @property
    def made(self) -> int:
        return self.done + len(self.failed)


@dataclass(frozen=True)
class GraphsRecord:
    """What the CUDA graphs really did in a run."""

    resolved: str  # the resolved choice: on (capture where the device allows) | off
    used: bool  # whether any decode step replayed a graph
    rows_with_graph_steps: int  # rows with at least one replayed step
    graph_steps: int  # replayed decode steps, all rows
    capture_errors: tuple[str, ...]  # why captures failed (the sessions went on eagerly)


@dataclass(frozen=True)
class RunInputs:
    """What a run is, known before its rows: its inputs, device and options (a RunRecord's fixed part)."""

    run_id: str  # this invocation's id (the rows it made carry it)
    started_at: float  # when the command started (Unix time)
    manifest: str  # the manifest as given
    shard: str | None  # --shard i/N
    rows_in_manifest: int  # valid rows of this shard
    invalid_rows: tuple[str, ...]  # each refused line's message
    model_dir: str | None  # the model directory (None: dummy weights without one)
    model_hash: str  # the model files' content hash (part of every fingerprint)
    model_yaml_sha256: str | None  # the model's cosyvoice3.yaml hash
    load_format: LoadFormat  # auto | dummy
    device: str  # the device the stages ran on (cpu | cuda)
    backend: str  # the backend (cpu | cuda | rocm)
    dtype: str  # the resolved run dtype
    dtype_requested: str  # --dtype as given
    options: dict[str, Any]  # every run option as resolved (the model's defaults filled in; null: none)
    output: dict[str, Any]  # how the audio files are written (format, encoding, rate, trimming)
    stage_dtypes: dict[str, str]  # each stage's compute dtype: talker (its backbone), flow (the DiT), hift
    engine: str  # local | ray
    llm: str  # the talker file (--llm: llm.pt, llm.rl.pt); dummy: random weights (--load-format dummy)
    provenance: dict[str, Any]
    # what made the audio, as the exports' cards state it: cosyclone's version, the talker, model_files (each
    # file read: file, bytes, sha256), the folder's licence (file, sha256, id, text; null: none), whether
    # the files are tagged, and the statement they carry


@dataclass(frozen=True)
class RunRecord(RunInputs):
    """One invocation of a run into a folder: a line of ``runs.jsonl``, ``summary.json``'s ``last_run``."""

    finished_at: float  # when it ended
    argv: tuple[str, ...]  # the command line
    host: str  # the machine's host name
    stopped_by: str | None  # the signal that stopped the run early (SIGTERM, SIGINT); None: it ran to the end
    invalid: int  # lines of this shard that validation refused
    todo: int  # rows this run set out to make
    done: int  # rows it wrote ok
    failed: int  # rows it wrote failed
    skipped: int  # rows already done with an unchanged fingerprint
    redone: int  # done rows this run wrote again because an input changed (or --overwrite); a stopped
    # run counts the rows it wrote, not those it meant to
    redone_by: dict[str, int]  # changed fingerprint part -> rows (of those counted in redone)
    retried: int  # rows whose earlier attempt failed or whose file was missing or torn
    not_written: int  # rows to make that this run did not write (a stop, a write error)
    failed_rows: dict[str, str | None]  # id -> error of each row this run wrote failed
    rows_not_in_manifest: int  # rows in the folder that this manifest lacks (kept)
    write_error: str | None  # why the folder could not be written (rows written before it are kept)
    talker_checkpoint_hits: int  # segments whose speech tokens came from the stage-0 checkpoint
    audio_seconds: float  # audio written ok by this run (model time, before trimming)
    wall_seconds: float  # seconds from the first model work to the last row
    total_wall_seconds: float  # seconds from the command's start to its end
    rows_per_s: float  # rows written per wall second
    throughput_audio_s_per_s: float  # audio seconds per wall second
    rtf: float | None  # wall seconds per audio second (None: no audio)
    versions: dict[str, str]  # cosyclone, torch, Python and the text normalizers' versions
    devices: tuple[str, ...]  # the GPUs torch saw, or this machine's processor
    algorithm: str  # the audio algorithm version (part of every fingerprint)
    ray: dict[str, Any] | None
    # --ray-actors/--actor-threads as given, the address, the live plan, each actor's node
    cuda_graphs: GraphsRecord  # what the CUDA graphs really did
    peak_memory: dict[str, int | None]
    # this process's peaks: host_rss_bytes, and on a GPU gpu_allocated_bytes
    # and gpu_reserved_bytes (a Ray run's actors are other processes: their engine_facts are not here)
    engine_facts: dict[str, Any] | None  # what the local engine chose and measured: sizes (talker slots,
    # code2wav budgets, prompt workers), graphs captured and reused, peak memory, stage seconds, decode
    # occupancy (mean_live_slots: running rows per decode step; decode_buckets: steps per slot bucket);
    # None when no engine ran here
    stage_seconds: dict[str, Any] | None
    # where the time went (a StageSeconds): each stage's busy and waiting
    # seconds, the talker's idle-with-work seconds and the stage that bounds the run; None when no engine ran
    # here

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``runs.jsonl`` and ``summary.json``'s ``last_run``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["argv"], out["invalid_rows"], out["devices"] = (
            list(self.argv),
            list(self.invalid_rows),
            list(self.devices),
        )
        out["cuda_graphs"] = {f.name: getattr(self.cuda_graphs, f.name) for f in fields(GraphsRecord)}
        out["cuda_graphs"]["capture_errors"] = list(self.cuda_graphs.capture_errors)
        return out


@dataclass(frozen=True)
class RunFacts(RunInputs):
    """What the job knows of a run before its rows, with what the record derives from (not recorded as
    such)."""

    text_frontend: TextFrontendName  # wetext | none (its versions are recorded)
    graphs_resolved: str  # on | off


def run_record(facts: RunFacts, resume: ResumePlan, tally: RunTally, *, prepared_failures: int, wall: float,
               write_error: str | None, stopped_by: str | None, graph_errors: Sequence[str],
               ray: dict[str, Any] | None, engine_facts: dict[str, Any] | None,
               peak_memory: dict[str, int | None], written: Collection[str] | None = None) -> RunRecord:
    """This invocation's record, from what it knew before and what its rows did. ``written``: the ids
    this run wrote among the rows it planned to redo (None: all of them)."""
    audio, made = tally.audio_seconds, tally.made
    redone = {rid: parts for rid, parts in resume.redone.items() if written is None or rid in written}
    redone_by: dict[str, int] = {}
    for parts in redone.values():
        for part in parts:
            redone_by[part] = redone_by.get(part, 0) + 1
    todo = len(resume.todo) + prepared_failures
    now = time.time()
    return RunRecord(
        **{f.name: getattr(facts, f.name) for f in fields(RunInputs)},
        finished_at=now,
        argv=tuple(sys.argv),
        host=socket.gethostname(),
        stopped_by=stopped_by,
        invalid=len(facts.invalid_rows),
        todo=todo,
        done=tally.done,
        failed=len(tally.failed),
        skipped=len(resume.done),
        redone=len(redone),
        redone_by=redone_by,
        retried=len(resume.retried),
        not_written=todo - made,
        failed_rows={r.id: r.error for r in tally.failed},
        rows_not_in_manifest=resume.foreign,
        write_error=write_error,
        talker_checkpoint_hits=tally.hits,
        audio_seconds=audio,
        wall_seconds=wall,
        total_wall_seconds=now - facts.started_at,
        rows_per_s=made / wall if wall > 0 and made else 0.0,
        throughput_audio_s_per_s=audio / wall if wall > 0 else 0.0,
        rtf=wall / audio if audio > 0 else None,
        versions=versions(facts.text_frontend),
        devices=tuple(devices(facts.device)),
        algorithm=_algorithm(),
        ray=ray,
        cuda_graphs=GraphsRecord(
            resolved=facts.graphs_resolved,
            used=tally.graph_steps > 0,
            rows_with_graph_steps=tally.graph_rows,
            graph_steps=tally.graph_steps,
            capture_errors=tuple(dict.fromkeys(graph_errors)),
        ),
        peak_memory=peak_memory,
        engine_facts=engine_facts,
        stage_seconds=engine_facts.get("stages") if engine_facts is not None else None,
    )


@dataclass(frozen=True)
class JobSummary:
    """The end of a run: the folder's totals, this invocation's record, and what went wrong."""

    totals: dict[str, Any]  # the folder totals its index keeps (report.totals_of) (summary.json's top level)
    last_run: RunRecord  # this invocation (summary.json's last_run, one line of runs.jsonl)
    failed: tuple[RowResult, ...]  # this run's failed rows (without audio), in arrival order
    write_error: str | None  # why the folder could not be written (rows finished before it are kept)
    written: int  # row records the writer committed in this run
    rows_total: int = 0  # the manifest's (shard's) rows: valid rows, or its lines when a stop came mid-read

    @property
    def exit_code(self) -> int:
        """143 or 130 when a signal stopped the run (README's table), else 0 when every row of the shard
        is done, 3 when some failed or were rejected (a write error, 4, is the caller's to report)."""
        if self.last_run.stopped_by in ("SIGTERM", "SIGINT"):
            return Exit[self.last_run.stopped_by]
        return Exit.ROWS_FAILED if self.last_run.failed + self.last_run.invalid else Exit.OK

    def stop_line(self) -> str | None:
        """The one line a stopped run ends with (None: no signal stopped it): how far it got, what to do."""
        run = self.last_run
        if run.stopped_by is None:
            return None
        done = run.skipped + run.done
        total = max(self.rows_total, done)
        rest = "; rerun the same command to resume" if done < total else ""
        failed = f", {run.failed} failed" if run.failed else ""
        return f"interrupted by {run.stopped_by}: {done} of {total} rows done{failed}{rest}"


def write_accounts(out: Path, record: RunRecord, kept: Mapping[str, int], *, write_error: str | None,
                   failed: Sequence[RowResult], written: int, rows_total: int = 0) -> JobSummary:
    """``summary.json`` (the folder totals its index keeps, ``kept``, and this run) and this run's line
    of ``runs.jsonl``."""
    from dataclasses import replace

    from cosyclone.folder.writer import write_summary

    totals = report.totals_of(kept)
    try:
        write_summary(out, {"folder_format": FOLDER_FORMAT, **totals, "out_dir": str(out),
                            "last_run": record.to_json()})
        runfolder.append_jsonl(out / runfolder.RUNS_NAME, record.to_json())
    except runfolder.OutputFolderError as exc:
        write_error = write_error or str(exc)
        record = replace(record, write_error=write_error)
    return JobSummary(totals=totals, last_run=record, failed=tuple(failed), write_error=write_error,
                      written=written, rows_total=rows_total or record.rows_in_manifest)


def devices(device: str) -> list[str]:
    """The device names a run used: the GPUs torch sees, or this machine's processor."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    from cosyclone.base.machine import processor_name

    return [processor_name()]


def versions(text_frontend: TextFrontendName) -> dict[str, str]:
    """The versions that change what a run produces: cosyclone, torch, Python, the text normalizers."""
    import torch

    from cosyclone.base.version import __version__
    from cosyclone.frontend.normalize import get_normalizer

    normalizer = {k: v for k, v in get_normalizer(text_frontend).version().items() if k != "text_frontend"}
    return {
        "cosyclone": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        **normalizer,
    }


def _algorithm() -> str:
    from cosyclone.folder.fingerprint import ALGORITHM_VERSION

    return ALGORITHM_VERSION
