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

#: Slot counts a decode step may run over (nano-vllm's batch-size buckets): powers of two with a
#: step of 1.5x between them above 8, so a step computes at most 1.5x its live rows (above 8), and a
#: 256-slot session meets at most 13 shapes (each a CUDA graph per ``kv_len`` bucket). The session's
#: own slot count is always a bucket too.
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def decode_buckets(slots: int) -> tuple[int, ...]:
    """The buckets a session of ``slots`` slots steps over: :data:`BUCKETS` below it, then ``slots``."""
    return (*(b for b in BUCKETS if b < slots), slots)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest of ``buckets`` that holds ``n`` slots (the largest when none does)."""
    return next((b for b in buckets if b >= n), buckets[-1])


class SlotScheduler:
    """The slots and the queue of waiting segments."""

    def __init__(self, slots: int, *, prefill_tokens: int | None = None) -> None:
        self.slots: list[Seq | None] = [None] * max(1, int(slots))
        self.prefill_tokens = prefill_tokens  # None: every free slot in one prefill
        self.waiting: deque[Seq] = deque()
        self.finished: list[Seq] = []  # finished, not yet returned by the session
        self.buckets = decode_buckets(len(self.slots))  # slot counts a step runs over

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

    def bucket(self) -> int:
        """Slots the next step computes: the smallest bucket that holds the highest running slot."""
        top = max((i for i, s in enumerate(self.slots) if s is not None), default=0)
        return bucket_for(top + 1, self.buckets)

    def compact(self) -> list[tuple[int, int]]:
        """Move running rows down so that the step runs over the smallest bucket that holds them and
        the waiting rows about to join: returns the moves (from slot, to slot), already made here.

        Why: rows enter the lowest free slots, but a long row admitted when many ran stays in its
        high slot when the others finish, and would keep every step over the largest bucket for the
        rest of its row (hundreds of steps); a move copies one slot's cache once. Nothing moves
        while the waiting rows would fill the gaps anyway."""
        running = len(self.running)
        target = bucket_for(min(len(self.slots), running + len(self.waiting)), self.buckets)
        if not running or self.bucket() <= target:
            return []
        free = [i for i in range(target) if self.slots[i] is None]
        high = [i for i in range(target, len(self.slots)) if self.slots[i] is not None]
        moves = list(zip(high, free, strict=False))  # running <= target: every high row finds a free slot
        for src, dst in moves:
            seq = self.slots[src]
            assert seq is not None
            self.slots[dst], self.slots[src], seq.slot = seq, None, dst
        return moves

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
