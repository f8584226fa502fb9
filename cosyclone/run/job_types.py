"""What a run into a folder says: its plan (``--dry-run``), its summary, and where its progress goes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cosyclone.engine import RowRecord
from cosyclone.run import fingerprint
from cosyclone.run import folder as runfolder

EXIT_OK, EXIT_ROWS_FAILED = 0, 3  # a finished run: every row done; some rows failed or were rejected


class ProgressSink(Protocol):
    """What :meth:`SynthJob.run` reports finished rows to (:class:`cosyclone.base.progress.Progress` is one)."""

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
class Prepared:
    """A folder's rows sorted out under its lock: fingerprints, the resume plan, rows that failed already."""

    ctx: fingerprint.RunContext
    fps: dict[str, tuple[str, dict[str, str]]]  # row id -> (fingerprint, parts) for every preparable row
    failed: list[RowRecord]  # rows whose fingerprint raised: failed records, ready for the writer
    resume: runfolder.ResumePlan
