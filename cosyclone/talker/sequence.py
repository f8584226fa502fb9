"""One segment's life in the talker: :class:`Seq`, the one object the scheduler and the session keep per
request.

Why one object: a request's prompt length, length limits, seed stream, slot, timing and harvest
belong together; kept as parallel per-ticket lists they drift apart as code changes. A ``Seq``
moves through :data:`SeqStatus`: ``waiting`` (added, no slot), ``running`` (in a slot),
``finished`` (its harvest read, or nothing to generate) and ``aborted`` (the session closed or
failed before it finished). Plain Python: nothing here touches the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cosyclone.talker.request import TalkerRequest
from cosyclone.talker.step import Harvest

#: Where a segment is in the talker.
SeqStatus = Literal["waiting", "running", "finished", "aborted"]


@dataclass(eq=False)
class Seq:
    """A segment in the talker (compared by identity: two requests may be equal)."""

    ticket: int  # arrival order within its session
    request: TalkerRequest | None  # None once its result was returned (a session may run all night)
    key: int  # the sampler's stream key: stream_key(seed, segment)
    prompt_len: int  # assembled prompt positions (sos, text ids, task id, prompt speech tokens)
    min_len: int  # stop ids blocked below this many speech tokens
    max_len: int  # speech tokens at most (<= 0: it never takes a slot)
    status: SeqStatus = "waiting"
    slot: int | None = None  # the slot it holds while running
    admitted_at: int = 0  # the session's global step of its first draw
    seconds: float = 0.0  # decode wall time shared out over the slots running in each window
    graph_steps: int = 0  # steps its slot ran as a CUDA graph replay
    harvest: Harvest | None = None  # its slot's tokens and counters, once read

    def cells(self) -> int:
        """Cache cells it needs: its prompt and every token it may generate."""
        return self.prompt_len + self.max_len

    def position(self, step: int) -> int:
        """Its next cache position at global step ``step`` (a row admitted at a has drawn step - a)."""
        return self.prompt_len + step - self.admitted_at
