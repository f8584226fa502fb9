"""What the pipeline calls a stage to do, as one injectable object: :class:`StageOps`.

Why: the scheduler (:mod:`.schedule`) decides when each stage runs; the stages themselves are the
models. Keeping the calls behind one small protocol lets the real scheduler run over stand-in
stages of set costs (how a projection of a run is checked) without touching a module global. The real
calls (:class:`RealOps`) are :mod:`.stages`' and :mod:`.isolation`'s, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from cosyclone.engine import isolation
from cosyclone.engine import stages as stage_calls
from cosyclone.engine.outcome import Failure, RowOutcome, RowResult
from cosyclone.engine.stages import PreparedBatch, Stages
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions

if TYPE_CHECKING:  # annotations only (the stage modules load when the engine builds them)
    from cosyclone.engine.prefetch import PromptAhead
    from cosyclone.frontend.conditioning import Request
    from cosyclone.talker.request import DecodeOptions, TalkerRequest
    from cosyclone.talker.results import TalkerResult


class TalkerSessionLike(Protocol):
    """What the pipeline uses of a :class:`~cosyclone.talker.session.TalkerSession`."""

    def add(self, requests: Sequence[TalkerRequest]) -> list[int]: ...

    def poll(self) -> list[tuple[int, TalkerResult]]: ...

    @property
    def waiting(self) -> int: ...

    @property
    def idle(self) -> bool: ...

    def close(self) -> None: ...


class StageOps(Protocol):
    """The stage calls the pipeline makes."""

    #: True when the talker and code2wav run on one device (the loaded stages: one torch device), so
    #: the run's accounting adds their busy seconds up (:class:`~cosyclone.engine.facts.StageSeconds`).
    shared_device: bool

    def prepare(self, rows: Sequence[ManifestRow], prompts: PromptAhead | None) -> PreparedBatch:
        """A batch's frontend (a bad row fails alone, in its outcome)."""
        ...

    def request(self, segment: Request) -> TalkerRequest:
        """A segment's talker request."""
        ...

    def talk(self, requests: Sequence[TalkerRequest], dec: DecodeOptions) -> list[TalkerResult]:
        """The talker over ``requests`` at once (no failure confined: :mod:`.isolation` does that)."""
        ...

    def session(self, slots: int) -> TalkerSessionLike:
        """A talker session of ``slots`` slots."""
        ...

    def retry(
        self, segments: Sequence[tuple[str, Request]], outcomes: dict[str, RowOutcome]
    ) -> dict[int, TalkerResult]:
        """The talker over ``segments`` with failures confined (after a shared session failed)."""
        ...

    def finish(self, prepared: PreparedBatch, results: dict[int, TalkerResult]) -> list[RowResult]:
        """code2wav over a batch whose segments all left the talker; its records."""
        ...

    def rows_alone(self, rows: Sequence[ManifestRow], exc: Failure) -> list[RowResult]:
        """Each row of a batch that raised outside the stages' guards, through every stage alone."""
        ...


class RealOps:
    """The loaded stages' calls."""

    shared_device = True  # the talker and code2wav run on the stages' one torch device

    def __init__(self, stages: Stages, opts: RunOptions, dec: DecodeOptions,
                 tokens: isolation.TokenCheckpoint | None) -> None:
        self.stages, self.opts, self.dec, self.tokens = stages, opts, dec, tokens

    def prepare(self, rows: Sequence[ManifestRow], prompts: PromptAhead | None) -> PreparedBatch:
        if prompts is None:
            return stage_calls.prepare_batch(self.stages, rows, self.opts)
        return stage_calls.prepare_batch(self.stages, rows, self.opts, prompts=prompts)

    def request(self, segment: Request) -> TalkerRequest:
        return stage_calls.to_talker_request(segment)

    def talk(self, requests: Sequence[TalkerRequest], dec: DecodeOptions) -> list[TalkerResult]:
        from cosyclone.talker import decode

        return decode.generate(self.stages.talker, list(requests), dec)

    def session(self, slots: int) -> TalkerSessionLike:
        from cosyclone.talker import decode

        return decode.TalkerSession(self.stages.talker, self.dec, slots=slots)

    def retry(
        self, segments: Sequence[tuple[str, Request]], outcomes: dict[str, RowOutcome]
    ) -> dict[int, TalkerResult]:
        return isolation.generate_isolated(self, segments, self.dec, outcomes, self.stages.policy.device)

    def finish(self, prepared: PreparedBatch, results: dict[int, TalkerResult]) -> list[RowResult]:
        return stage_calls.finish_batch(self.stages, prepared, results, self.opts)

    def rows_alone(self, rows: Sequence[ManifestRow], exc: Failure) -> list[RowResult]:
        return isolation.rows_alone(self, self.stages, rows, self.opts, exc, self.tokens)
