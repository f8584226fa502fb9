"""A run's rows in parts: the manifest's chunks of lines, in file order, each planned on its own.

Why parts: the first row of a night of a million rows should come out seconds after the start,
not after every line was validated and normalized. A streamed manifest
(:func:`cosyclone.manifest.iter_manifest`) hands its rows over one chunk of
:data:`~cosyclone.manifest.stream.CHUNK_LINES` lines at a time, and the job prepares and runs each
chunk as it comes. So that a row is rendered in the same batch whoever runs it, every path plans
batches per part: a manifest read whole (a shard, a Ray run, a dry run) is cut into the same parts
by line ordinal (:func:`split_parts`), and :func:`plan_parts` plans each on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from cosyclone.engine import plan_batches
from cosyclone.manifest import Manifest, ManifestRow
from cosyclone.run.resume import ResumePlan


def split_parts(manifest: Manifest, lines: int) -> Iterator[Manifest]:
    """``manifest``'s rows and errors in parts of ``lines`` non-blank lines (by ordinal), file order;
    what a streamed read of the same file yields chunk by chunk."""
    buckets: dict[int, Manifest] = {}

    def part(line: int | None) -> Manifest:
        k = manifest.ordinals.get(line, 0) // lines if line is not None else 0
        if k not in buckets:
            buckets[k] = Manifest(path=manifest.path)
        return buckets[k]

    for row in manifest.rows:  # one pass each: file order is kept within a part
        part(row.line).rows.append(row)
    for err in manifest.errors:
        part(err.line).errors.append(err)
    for k in sorted(buckets):
        yield buckets[k]


def plan_parts(parts: Sequence[Sequence[ManifestRow]], batch_size: int,
               token_budget: int | None) -> list[list[ManifestRow]]:
    """Each part's rows planned on their own (:func:`~cosyclone.engine.plan_batches`), parts in order."""
    return [batch for rows in parts for batch in plan_batches(rows, batch_size, token_budget)]


@dataclass
class ResumeTotals:
    """The resume plans of a run's parts, added up (what the run logs and records at its end)."""

    plan: ResumePlan = field(default_factory=lambda: ResumePlan([], [], {}, []))

    def add(self, part: ResumePlan) -> None:
        self.plan.todo += part.todo
        self.plan.done += part.done
        self.plan.redone.update(part.redone)
        self.plan.retried += part.retried
