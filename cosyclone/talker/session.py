"""The talker's scheduler over a fixed-capacity slot KV cache (continuous batching).

Why this shape: the decode step (:class:`~cosyclone.talker.step.SlotStep`) has fixed shapes
whatever rows are active, so it can be compiled or graph-captured, and a freed slot is refilled at
once: with ``DecodeOptions.slots`` smaller than the number of requests, the next request is
prefilled into a slot as soon as one finishes, instead of the batch waiting for its longest row.
Newcomers are prefilled right-padded with their own positions and key masks, so every row
computes what it would alone (the same tokens; logits equal up to fp32 rounding of a different
kernel shape): apart from the decode steps on a GPU (a captured step keeps its shapes), and on a
CPU inside the next step's pass while the other slots decode (``fused_admission``: the step there
is bound by reading the weights, which a separate prefill would read a second time). The host
reads the finished flags every ``StepMechanics.sync_every`` steps; tokens, stop flags, length
rules and diagnostic counters stay on the device in between (on a CPU, where a read costs
nothing, every step). On CUDA the read lags a window (``lagged_reads``): the flags are copied
to pinned memory without blocking and read once the next window is queued, so the device never
waits for the host's bookkeeping. :class:`TalkerSession` is the scheduler; requests may join it
while it decodes (a pipeline run keeps one for the whole manifest), and
:func:`~cosyclone.talker.decode.generate` is a session handed every request at once.

The RAS sampler runs inside the step (:mod:`cosyclone.talker.slot_sampler`), so no Python runs
between a step's draw and its feed (tests that need to, to inject faults or force tokens, wrap
the step from outside: tests/host_session.py). Each request carries its row's seed, already
derived once by the caller (manifest ``seed``, else ``row_seed(--seed, id)``), and its segment
index; the sampler draws from ``stream_key(seed, segment)`` and reports that seed unchanged.
Nothing here hashes the seed again.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from cosyclone.talker.graph_pool import PROCESS, PooledStep
from cosyclone.talker.graphs import GraphChoice, GraphedStep, resolve_cuda_graphs
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.request import DecodeOptions, TalkerRequest, length_limits, prompt_batch, prompt_length
from cosyclone.talker.results import TalkerResult, harvest_tokens, talker_result
from cosyclone.talker.sampler import SamplerOptions, stream_key
from cosyclone.talker.slot_sampler import SlotSampler, legacy_generator
from cosyclone.talker.step import Admit, HostRead, SlotStep, to_device


class _Flags:
    """One window's finished flags on their way to the host, and which ticket each slot held then.

    On CUDA the copy goes to pinned memory without blocking, with an event to wait on when it is
    read (by then the next window is queued, so the device never idles on the host).
    """

    def __init__(self, running: Tensor, rows: Sequence[int | None], *, keep: bool) -> None:
        """``keep``: the flags are read after more steps ran, so take a copy of them now."""
        self.rows = list(rows)
        self.host = HostRead(running, clone=keep)

    def read(self) -> list[bool]:
        return self.host.tolist()


class TalkerSession:
    """A decode that requests join while it runs: the talker's side of continuous batching.

    Requests are added in any number of calls (:meth:`add`, each gets a ticket: its index in
    arrival order); :meth:`poll` admits waiting requests into free slots (lowest slot first, in
    arrival order), runs one window of ``StepMechanics.sync_every`` steps and returns the requests
    that finished. A session can span a whole manifest, so the next rows take the slots of the
    finished ones instead of waiting for a batch to drain, and the engine (and its captured graphs)
    lives for the whole run. :func:`generate` is a session that is given every request at once.

    The host never needs a device value to know a slot's position: a row admitted at global step a
    has taken g - a draws at step g. When a newcomer needs more cache cells or token cells than the
    engine holds, the engine grows (:meth:`SlotStep.grow`; rows already running are unaffected).
    """

    def __init__(self, model: CosyVoice3LM, options: DecodeOptions | None = None, *, slots: int,
                 capacity: int = 1, token_capacity: int = 1) -> None:
        options = options or DecodeOptions()
        self.model, self.options = model, options
        cfg = model.cfg
        self.n_slots = max(1, int(slots))
        self.sampler_options: SamplerOptions = options.sampler or SamplerOptions.from_config(cfg.sampling)
        if options.mechanics.capacity is not None:
            capacity = options.mechanics.capacity
        self.graphs = self._choice()
        self.pooled: PooledStep | None = None  # with graphs: the process's step, borrowed until close()
        self.graphed: GraphedStep | None = None
        self.engine: SlotStep
        if self.graphs.enabled:
            key = (self.n_slots, self.sampler_options)
            self.pooled = PROCESS.acquire(model, key, self._new_step,
                                          capacity=max(1, capacity, options.reserve_positions or 0),
                                          token_capacity=max(1, token_capacity, options.reserve_positions or 0))
            self._release = weakref.finalize(self, PROCESS.release, self.pooled)  # also if never closed
            self.engine = self.pooled.step
            self.graphed = self.pooled.graphed
        else:
            self.engine = self._new_step(max(1, capacity), max(1, token_capacity))
        # per ticket
        self.requests: list[TalkerRequest | None] = []  # by ticket (None once its result was returned)
        self.keys: list[int] = []
        self.plen: list[int] = []
        self.min_len: list[int] = []
        self.max_len: list[int] = []
        self.seconds: list[float] = []  # decode time shared out over the slots running in each window
        self.slot_row: list[int | None] = [None] * self.n_slots
        self.admitted_at = [0] * self.n_slots
        self.g = 0  # global step
        self.pending: deque[int] = deque()
        self.ready: list[int] = []  # finished tickets not yet returned by poll()
        self.done: dict[int, Any] = {}  # ticket -> Harvest (absent: never took a slot, max_len <= 0)
        self.reading: list[tuple[list[int], Any]] = []  # (tickets, PendingHarvest) queued, not yet read
        self.graph_steps: list[int] = []  # per ticket: steps its slot ran as a CUDA graph replay
        self.graphs_ended: tuple[GraphChoice, int] | None = None  # at close(): the choice as it ended, graphs captured
        lagged = options.mechanics.lagged_reads
        self.lagged = model.device.type == "cuda" if lagged is None else bool(lagged)
        self.unread: _Flags | None = None  # the last window's flags, when reads lag a window
        self.step_fn: Callable[[], None] = self.engine.step if self.graphed is None else self.graphed
        if options.mechanics.compile:
            self.step_fn = torch.compile(self.engine.step, fullgraph=True, backend=options.mechanics.compile)
        self.graphs_captured = 0  # by graph sets dropped when the engine grew
        self.graphs_replayed = 0  # likewise
        # the pooled step's counts when this session took it: what it did itself is the difference
        self._captured0 = self.graphed.captured if self.graphed is not None else 0
        self._replayed0 = self.graphed.replayed if self.graphed is not None else 0
        cpu = model.device.type == "cpu"
        self.sync_every = max(1, options.mechanics.sync_every or (1 if cpu else 4))
        fuse = options.mechanics.fused_admission
        self.fuse = cpu and not options.mechanics.compile and self.graphed is None if fuse is None else bool(fuse)

    def _new_step(self, capacity: int, token_capacity: int) -> SlotStep:
        """A slot step of this session's shape (its own sampler; with graphs, the pool keeps it)."""
        cfg = self.model.cfg
        sampler = SlotSampler(self.sampler_options, slots=self.n_slots, vocab=cfg.decoder_size,
                              speech_token_size=cfg.speech_token_size, device=self.model.device)
        return SlotStep(self.model, slots=self.n_slots, capacity=capacity, token_capacity=token_capacity,
                        sampler=sampler)

    def _choice(self) -> GraphChoice:
        """Resolve ``cuda_graphs``: on routes the step through the process's pooled, per-``kv_len``
        graphs (:mod:`~cosyclone.talker.graph_pool`); off for good once a capture failed in the process."""
        opts = self.options
        choice = resolve_cuda_graphs(opts.cuda_graphs, self.model.device, draw=self.sampler_options.draw,
                                     compile=opts.mechanics.compile, anywhere=PROCESS.capture_anywhere)
        if choice.enabled and PROCESS.disabled is not None:
            return GraphChoice(False, f"off for this process since a capture failed: {PROCESS.disabled}")
        return choice

    def graph_report(self) -> tuple[GraphChoice, int]:
        """The graph choice as the decode ended and the graphs this session captured."""
        if self.graphed is None:
            return self.graphs, 0
        captured = self.graphs_captured + self.graphed.captured - self._captured0
        if self.graphed.reason is not None:
            return GraphChoice(False, self.graphed.reason), captured
        return self.graphs, captured

    @property
    def graphs_used(self) -> bool:
        """True once a decode step really ran as a replayed CUDA graph (not what was asked: what ran)."""
        mine = self.graphed.replayed - self._replayed0 if self.graphed is not None else 0
        return self.graphs_replayed + mine > 0

    @property
    def graph_capture_error(self) -> str | None:
        """Why a capture failed (the session decodes eagerly since), None when none did."""
        return self.graphed.reason if self.graphed is not None else None

    # -- requests in ----------------------------------------------------------------------------------

    def add(self, requests: Sequence[TalkerRequest]) -> list[int]:
        """Queue ``requests`` behind those already waiting; returns their tickets."""
        tickets = []
        for req in requests:
            t = len(self.requests)
            lo, hi = length_limits(self.model, self.options, req)
            self.requests.append(req)
            self.keys.append(self._stream_key(req))
            self.plen.append(prompt_length(req))
            self.min_len.append(lo)
            self.max_len.append(hi)
            self.seconds.append(0.0)
            self.graph_steps.append(0)
            if self.max_len[t] > 0:
                self.pending.append(t)
            else:
                self.ready.append(t)  # nothing to generate: it never takes a slot
            tickets.append(t)
        return tickets

    def _request(self, t: int) -> TalkerRequest:
        req = self.requests[t]
        assert req is not None, f"ticket {t} was already returned"
        return req

    @staticmethod
    def _stream_key(req: TalkerRequest) -> int:
        return stream_key(req.seed, req.segment)

    @property
    def waiting(self) -> int:
        """Requests added but not yet in a slot."""
        return len(self.pending)

    @property
    def active(self) -> int:
        """Requests in a slot."""
        return sum(r is not None for r in self.slot_row)

    @property
    def idle(self) -> bool:
        """Nothing waiting, nothing running, nothing finished left for :meth:`poll` to return."""
        return not self.pending and not self.active and not self.reading and not self.ready

    # -- decoding -------------------------------------------------------------------------------------

    def _fit(self, tickets: Sequence[int]) -> None:
        """Grow the engine so that ``tickets`` fit (prompt + max_len cells, max_len token cells)."""
        need = max(self.plen[t] + self.max_len[t] for t in tickets)
        need_tokens = max(self.max_len[t] for t in tickets)
        eng = self.engine
        if need <= eng.capacity and need_tokens <= eng.token_capacity:
            return
        if self.options.mechanics.capacity is not None and need > eng.capacity:
            raise ValueError(f"capacity {eng.capacity} is below a row's prompt + max_len ({need})")
        def grown(need: int, have: int, bucket: int = 1) -> int:
            """``have`` if it suffices, else at least 1.5x it (a few growths per manifest), bucketed."""
            return have if need <= have else -(-max(need, have + have // 2) // bucket) * bucket

        if eng.grow(grown(need, eng.capacity, self.options.mechanics.kv_bucket or 1), grown(need_tokens, eng.token_capacity)):
            self._regraph()

    def _regraph(self) -> None:
        """The captured graphs point at the old buffers: capture again from now on (a failed
        capture stays failed: :meth:`PooledStep.regraph`)."""
        if self.pooled is not None and self.graphed is not None:
            self.graphs_captured += self.graphed.captured - self._captured0
            self.graphs_replayed += self.graphed.replayed - self._replayed0
            self._captured0 = self._replayed0 = 0
            self.graphed = self.pooled.regraph()
            self.step_fn = self.graphed
        # a compiled step needs nothing here: its guards see the new buffer shapes and recompile

    def _admit(self) -> Admit | None:
        """Fill free slots (lowest first) with the next waiting requests, prefilled together: apart
        now, or, with fused admission while rows run, returned as the next step's :class:`Admit`
        (:meth:`_started` once that step ran)."""
        free = [s for s, r in enumerate(self.slot_row) if r is None]
        take = [(s, self.pending.popleft()) for s in free[:len(self.pending)]]
        if not take:
            return None
        slots, rows = [s for s, _ in take], [r for _, r in take]
        self._fit(rows)
        embeds, lengths = prompt_batch(self.model, [self._request(r) for r in rows])
        max_len = [self.max_len[r] for r in rows]
        if self.fuse and self.active:  # rows running: the newcomers ride along in the next step
            for s, r in take:
                self.slot_row[s] = r
                self.admitted_at[s] = self.g + 1  # their first draw is the step after
            return Admit(slots=slots, embeds=embeds, lengths=lengths, max_len=max_len)
        self.engine.admit(slots, embeds, lengths, max_len)
        for s, r in take:
            self.slot_row[s] = r
            self.admitted_at[s] = self.g
        self._started(slots)
        return None

    def _row_in(self, slot: int) -> int:
        """The request index of the row a busy slot holds."""
        row = self.slot_row[slot]
        assert row is not None, f"slot {slot} holds no row"
        return row

    def _started(self, slots: Sequence[int]) -> None:
        """The in-step sampler's state for rows just prefilled into ``slots``."""
        sampler = self.engine.sampler
        if sampler is None:
            return
        dev = self.model.device
        rows = [self._row_in(s) for s in slots]
        sampler.reset(to_device(slots, dev), to_device([self.keys[r] for r in rows], dev),
                      to_device([self.min_len[r] for r in rows], dev))
        if sampler.options.draw == "legacy-multinomial":
            for s, r in zip(slots, rows, strict=True):
                req = self._request(r)
                sampler.generators[s] = legacy_generator(req.seed, req.segment, self.keys[r], dev)

    def _kv_len(self, window: int) -> int | None:
        """Cells the next ``window`` steps read: a bucketed bound on every slot's position."""
        bucket = self.options.mechanics.kv_bucket
        if not bucket:
            return None
        bound = max(self.plen[r] + self.g - self.admitted_at[s] + window
                    for s, r in enumerate(self.slot_row) if r is not None)
        return min(self.engine.capacity, -(-bound // bucket) * bucket)

    def _window(self) -> None:
        """Admit, run ``sync_every`` steps, read the finished slots once.

        Finished slots are freed at once and their values queued for the host
        (:meth:`SlotStep.harvest_start`); with lagged reads they are read one window later,
        after the next window's steps are queued, so the device never waits for this read."""
        queued, self.reading = self.reading, []
        admit = self._admit()
        if self.active:
            self._steps(admit)
        if not (self.lagged and self.active):  # nothing queued after it: read now
            queued, self.reading = queued + self.reading, []
        for tickets, pending in queued:
            for r, h in zip(tickets, pending.harvests(), strict=True):
                self.done[r] = h
                self.ready.append(r)

    def _steps(self, admit: Admit | None) -> None:
        """One window of steps, then the (lagged) read of the finished flags."""
        t0 = time.perf_counter()
        window = self.sync_every
        self.engine._kv_len = self._kv_len(window)
        replayed = 0
        for _ in range(window):
            if admit is not None:
                self.engine.step(admit)  # eager: a step that admits has its own shapes
            else:
                self.step_fn()
                replayed += self.graphed is not None and self.graphed.last_replayed
            if admit is not None:
                self._started(admit.slots)
                admit = None
            self.g += 1
        lag = self.lagged  # read the window before this one, queued meanwhile
        flags: _Flags | None = _Flags(self.engine.state.running, self.slot_row, keep=lag)
        if lag:
            flags, self.unread = self.unread, flags
        in_slots = [r for r in self.slot_row if r is not None]
        share = (time.perf_counter() - t0) / len(in_slots)
        for r in in_slots:
            self.seconds[r] += share
            self.graph_steps[r] += replayed
        if flags is None:
            return
        running = flags.read()  # the one read per window
        # a slot read as finished is one whose row still holds it (with lagged reads, a row freed
        # after the previous read can be finished in this one too, or its slot already refilled)
        finished = [s for s, r in enumerate(flags.rows) if r is not None and self.slot_row[s] == r and not running[s]]
        if finished:
            tickets = [self.slot_row[s] for s in finished]
            self.reading.append(([r for r in tickets if r is not None], self.engine.harvest_start(finished)))
            for s in finished:
                self.slot_row[s] = None

    @torch.no_grad()
    def poll(self) -> list[tuple[int, TalkerResult]]:
        """One window; the (ticket, result) pairs of the requests that finished (in ticket order)."""
        if not self.ready:
            self._window()
        out = [(t, self._result(t)) for t in sorted(self.ready)]
        for t in self.ready:  # a session may run all night: keep nothing of a returned request
            self.done.pop(t, None)
            self.requests[t] = None
        self.ready.clear()
        return out

    def _result(self, t: int) -> TalkerResult:
        """Ticket ``t``'s result from its harvest (the in-step sampler's counters become ``diagnostics``)."""
        return talker_result(self._request(t), self.done.get(t), self.sampler_options,
                             min_len=self.min_len[t],
                             max_len=self.max_len[t], seconds=self.seconds[t], graph_steps=self.graph_steps[t])

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
        self.graphs_ended = self.graph_report()
        if self.pooled is not None:
            self._release()  # once: the finalizer does nothing after this
        else:
            self.engine.cache = self.model.new_cache(self.n_slots, 1)  # the cells go; a closed session is done

    def _tokens(self, t: int) -> tuple[list[int], list[int], str]:
        """Ticket ``t``'s raw tokens, kept tokens and engine stop reason (:func:`harvest_tokens`)."""
        return harvest_tokens(self.done.get(t))
