"""Which waiting segments take which free slots, and when: the talker's scheduler, plain Python.

Why apart from the step runner (:mod:`.step_runner`): admission is bookkeeping over
:class:`~cosyclone.talker.sequence.Seq` objects and never touches the device, so it reads in one
sitting and runs with no model at all. Rows enter free slots lowest slot first, in arrival
order; a prefill budget (``prefill_tokens``: padded prompt positions per prefill, from the sizing
rule on a GPU) caps how many newcomers are prefilled together, so the first admission of a run
does not prefill every slot at once. One newcomer is always admitted (a prompt longer than the
budget still runs, alone). A row's tokens do not depend on when or where it is admitted.
"""

from __future__ import annotations

from collections import deque

from cosyclone.talker.sequence import Seq


class SlotScheduler:
    """The slots and the queue of waiting segments."""

    def __init__(self, slots: int, *, prefill_tokens: int | None = None) -> None:
        self.slots: list[Seq | None] = [None] * max(1, int(slots))
        self.prefill_tokens = prefill_tokens  # None: every free slot in one prefill
        self.waiting: deque[Seq] = deque()
        self.finished: list[Seq] = []  # finished, not yet returned by the session

    def add(self, seq: Seq) -> None:
        """Queue ``seq`` behind the waiting ones; a segment with nothing to generate is finished at once."""
        if seq.max_len > 0:
            seq.status = "waiting"
            self.waiting.append(seq)
        else:
            self.finish(seq)

    @property
    def running(self) -> list[Seq]:
        """The segments in slots, by slot."""
        return [s for s in self.slots if s is not None]

    def admissions(self) -> list[Seq]:
        """Take waiting segments into free slots (lowest first) within the prefill budget; each gets
        its slot and status ``running``."""
        free = [i for i, s in enumerate(self.slots) if s is None]
        taken: list[Seq] = []
        longest = 0
        for slot in free:
            if not self.waiting:
                break
            nxt = self.waiting[0]
            width = max(longest, nxt.prompt_len)
            if taken and self.prefill_tokens is not None and width * (len(taken) + 1) > self.prefill_tokens:
                break
            self.waiting.popleft()
            longest = width
            nxt.slot, nxt.status = slot, "running"
            self.slots[slot] = nxt
            taken.append(nxt)
        return taken

    def holds(self, slot: int, seq: Seq | None) -> bool:
        """Whether ``slot`` still holds ``seq`` (a lagged read may name a slot refilled since)."""
        return seq is not None and self.slots[slot] is seq

    def release(self, seq: Seq) -> None:
        """``seq`` left its slot (finished on the device; its harvest is on its way)."""
        assert seq.slot is not None and self.slots[seq.slot] is seq
        self.slots[seq.slot] = None
        seq.slot = None

    def finish(self, seq: Seq) -> None:
        """``seq``'s harvest is read (or it never needed a slot): ready to be returned."""
        seq.status = "finished"
        self.finished.append(seq)

    def abort_all(self) -> list[Seq]:
        """Every segment not finished leaves (the session closes or failed): marked ``aborted``."""
        gone = [*self.running, *self.waiting]
        for seq in gone:
            seq.status, seq.slot = "aborted", None
        self.slots = [None] * len(self.slots)
        self.waiting.clear()
        return gone
