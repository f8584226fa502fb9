"""What a run into a folder plans (``--dry-run``), what it prepared per part, and where its progress goes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cosyclone.engine import RowResult
from cosyclone.folder import fingerprint
from cosyclone.run.resume import ResumePlan


class ProgressSink(Protocol):
    """What :meth:`SynthJob.run` reports finished rows to (:class:`cosyclone.base.progress.Progress` is
    one)."""

    def update(self, result: RowResult) -> None: ...

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


@dataclass
class Prepared:
    """A folder's rows sorted out under its lock: fingerprints, the resume plan, rows that failed already."""

    ctx: fingerprint.RunContext
    fps: dict[str, tuple[str, dict[str, str]]]  # row id -> (fingerprint, parts) for every preparable row
    failed: list[RowResult]  # rows whose fingerprint raised: failed results, ready for the writer
    resume: ResumePlan
