"""The talker's side of continuous batching: a session that requests join while it decodes.

Why this shape (nano-vllm's): one :class:`~cosyclone.talker.sequence.Seq` per request, a
plain-Python :class:`~cosyclone.talker.scheduler.SlotScheduler` that decides which waiting
segments take which free slots, and a :class:`~cosyclone.talker.step_runner.StepRunner` that owns
the model, the cache and the graphs. The session joins them one window at a time: admit, run
``StepMechanics.sync_every`` steps, read the finished flags once, queue the finished slots'
harvests. The decode step has fixed shapes whatever rows are active, so it can be compiled or
graph-captured, and a freed slot is refilled at once instead of the batch waiting for its longest
row. Newcomers are prefilled right-padded with their own positions and key masks, so every row
computes what it would alone: apart from the decode steps on a GPU (a captured step keeps its
shapes), and on a CPU inside the next step's pass while the other slots decode
(``fused_admission``: the step there is bound by reading the weights). On CUDA the read lags a
window (``lagged_reads``): the flags are copied to pinned memory without blocking and read once
the next window is queued, so the device never waits for the host's bookkeeping.

The RAS sampler runs inside the step (:mod:`cosyclone.talker.slot_sampler`), so no Python runs
between a step's draw and its feed. Each request
carries its row's seed, already derived once by the caller, and its segment index; the sampler
draws from ``stream_key(seed, segment)``. Nothing here hashes the seed again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosyclone.talker.graphs import GraphChoice
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.request import DecodeOptions, TalkerRequest, length_limits, prompt_length
from cosyclone.talker.results import TalkerResult, talker_result
from cosyclone.talker.sampler import stream_key
from cosyclone.talker.scheduler import SlotScheduler
from cosyclone.talker.sequence import Seq
from cosyclone.talker.step import Admit, PendingHarvest
from cosyclone.talker.step_runner import Flags, StepRunner


class TalkerSession:
    """A decode that requests join while it runs.

    Requests are added in any number of calls (:meth:`add`, each gets a ticket: its index in
    arrival order); :meth:`poll` admits waiting requests into free slots, runs one window and
    returns the requests that finished. A session can span a whole manifest, so the next rows take
    the slots of the finished ones, and the runner (and its captured graphs) lives for the whole
    run. :func:`~cosyclone.talker.decode.generate` is a session given every request at once.
    """

    def __init__(self, model: CosyVoice3LM, options: DecodeOptions | None = None, *, slots: int,
                 capacity: int = 1, token_capacity: int = 1) -> None:
        options = options or DecodeOptions()
        self.model, self.options = model, options
        self.runner = StepRunner(
            model, options, slots=slots, capacity=capacity, token_capacity=token_capacity
        )
        self.n_slots = self.runner.n_slots
        self.sampler_options = self.runner.sampler_options
        self.scheduler = SlotScheduler(self.n_slots, prefill_tokens=options.prefill_tokens)
        # by ticket: the requests not yet returned (a session may serve a whole night: a returned one goes)
        self.seqs: dict[int, Seq] = {}
        self.tickets = 0  # tickets handed out (the next one's number)
        self.g = 0  # global step
        self.reading: list[tuple[list[Seq], PendingHarvest]] = []  # harvests queued, not yet read
        self.unread: Flags | None = None  # the last window's flags, when reads lag a window
        # at close(): the choice as it ended, captured
        self.graphs_ended: tuple[GraphChoice, int] | None = None

    # -- what the runner owns: its step (``runner.engine``), graphs (``runner.graphs``, ``graph_report()``,
    # ``graphs_used``) as the session's callers read them

    @property
    def graph_capture_error(self) -> str | None:
        """Why a capture failed (the session decodes eagerly since), None when none did."""
        return self.runner.graphed.reason if self.runner.graphed is not None else None

    # -- requests in ----------------------------------------------------------------------------------

    def add(self, requests: Sequence[TalkerRequest]) -> list[int]:
        """Queue ``requests`` behind those already waiting; returns their tickets."""
        tickets = []
        for req in requests:
            lo, hi = length_limits(self.model, self.options, req)
            seq = Seq(ticket=self.tickets, request=req, key=stream_key(req.seed, req.segment),
                      prompt_len=prompt_length(req), min_len=lo, max_len=hi)
            self.seqs[seq.ticket] = seq
            self.tickets += 1
            self.scheduler.add(seq)
            tickets.append(seq.ticket)
        return tickets

    def _request(self, t: int) -> TalkerRequest:
        req = self.seqs[t].request
        assert req is not None, f"ticket {t} was already returned"
        return req

    @property
    def waiting(self) -> int:
        """Requests added but not yet in a slot."""
        return len(self.scheduler.waiting)

    @property
    def active(self) -> int:
        """Requests in a slot."""
        return len(self.scheduler.running)

    @property
    def idle(self) -> bool:
        """Nothing waiting, nothing running, nothing finished left for :meth:`poll` to return."""
        return not self.waiting and not self.active and not self.reading and not self.scheduler.finished

    # -- decoding -------------------------------------------------------------------------------------

    def _admit(self) -> Admit | None:
        """The scheduler's newcomers, prefilled together: now, or, with fused admission while rows
        run, as the next step's :class:`Admit` (their first draw is then the step after)."""
        running = self.active
        newcomers = self.scheduler.admissions()
        if not newcomers:
            return None
        # the cache grown so that they fit (prompt + max_len cells, max_len token cells)
        self.runner.fit(max(s.cells() for s in newcomers), max(s.max_len for s in newcomers))
        admit = self.runner.prefill(newcomers, ride_along=running > 0)
        for s in newcomers:
            s.admitted_at = self.g + (admit is not None)
        return admit

    def _window(self) -> None:
        """Admit, run a window of steps, read the finished slots once.

        Finished slots are freed at once and their values queued for the host; with lagged reads
        they are read one window later, after the next window's steps are queued."""
        queued, self.reading = self.reading, []
        self.runner.move(self.scheduler.compact())  # before admission: newcomers fill what is left
        admit = self._admit()
        if self.active:
            self._steps(admit)
        if not (self.runner.lagged and self.active):  # nothing queued after it: read now
            queued, self.reading = queued + self.reading, []
        for seqs, pending in queued:
            for seq, h in zip(seqs, pending.harvests(), strict=True):
                seq.harvest = h
                self.scheduler.finish(seq)

    def _steps(self, admit: Admit | None) -> None:
        """One window of steps, then the (lagged) read of the finished flags."""
        runner = self.runner
        window = runner.sync_every
        running = self.scheduler.running
        kv_len = runner.kv_len(max(s.position(self.g) + window for s in running))
        newcomers = [s for s in running if admit is not None and s.slot in admit.slots]
        seconds, replayed = runner.window(admit, newcomers, kv_len, bucket=self.scheduler.bucket(),
                                          live=len(running))
        self.g += window
        flags: Flags | None = runner.flags(self.scheduler.slots)
        if runner.lagged:  # read the window before this one, queued meanwhile
            flags, self.unread = self.unread, flags
        share = seconds / len(running)
        for s in running:
            s.seconds += share
            s.graph_steps += replayed
        if flags is None:
            return
        still = flags.read()  # the one read per window
        # a slot read as finished is one whose row still holds it (with lagged reads, a row freed after
        # the previous read can be finished in this one too, or its slot already refilled)
        held = [seq for seq in flags.held]
        finished = [i for i, seq in enumerate(held) if isinstance(seq, Seq) and self.scheduler.holds(i, seq)
                    and not still[i]]
        if finished:
            seqs = [self.scheduler.slots[i] for i in finished]
            done = [s for s in seqs if s is not None]
            self.reading.append((done, runner.harvest_start(finished)))
            for s in done:
                self.scheduler.release(s)

    @torch.no_grad()
    def poll(self) -> list[tuple[int, TalkerResult]]:
        """One window; the (ticket, result) pairs of the requests that finished (in ticket order)."""
        if not self.scheduler.finished:
            self._window()
        ready = sorted(self.scheduler.finished, key=lambda s: s.ticket)
        out = [(s.ticket, self._result(s.ticket)) for s in ready]
        for s in ready:  # a session may run all night: keep nothing of a returned request
            s.harvest, s.request = None, None
            del self.seqs[s.ticket]
        self.scheduler.finished.clear()
        return out

    def _result(self, t: int) -> TalkerResult:
        """Ticket ``t``'s result from its harvest (the in-step sampler's counters become ``diagnostics``)."""
        s = self.seqs[t]
        return talker_result(self._request(t), s.harvest, self.sampler_options, min_len=s.min_len,
                             max_len=s.max_len, seconds=s.seconds, graph_steps=s.graph_steps)

    @torch.no_grad()
    def drain(self) -> list[tuple[int, TalkerResult]]:
        """Decode until nothing waits or runs; every result not yet returned."""
        out: list[tuple[int, TalkerResult]] = []
        while not self.idle:
            out.extend(self.poll())
        return out

    def close(self) -> None:
        """Free what the session owns: its own cache goes, or its pooled step goes back to the process
        (cache and graphs kept for the next). What its graphs did stays readable (:attr:`graphs_ended`)."""
        self.graphs_ended = self.runner.graph_report()
        self.scheduler.abort_all()
        self.runner.close()
