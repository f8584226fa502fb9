"""The talker's step runner: the model, its slot KV cache and the captured graphs, one window at a time.

Why apart from the scheduler (:mod:`.scheduler`): everything that touches the device is here
(cache sizing and growth, prefill, the fixed-shape step as a CUDA graph, a compiled function or
eager, the finished flags on their way to the host), everything that decides is there. The
session hands it the segments to start (:class:`~cosyclone.talker.sequence.Seq`, in the slots the
scheduler gave them), the bucket of slots each window steps over and the rows to move down (the
scheduler's :meth:`compact`); it calls nothing back, and it tallies the steps' occupancy for the
run record (:mod:`.occupancy`).

Cache: with CUDA graphs the step is the process's pooled one (:mod:`.graph_pool`), otherwise its
own; either way the cells a slot is sized for (``DecodeOptions.reserve_positions``, the sizing
rule's figure on a GPU) are allocated up front, so the eager fallback after a failed capture
never starts from a one-cell cache grown by reallocation. Longer rows grow it
(:meth:`SlotStep.grow`, at least 1.5x, bucketed) and the graphs are captured again.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cosyclone.talker.graph_pool import PROCESS, PooledStep
from cosyclone.talker.graphs import GraphChoice, GraphedStep, resolve_cuda_graphs
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.occupancy import PROCESS_OCCUPANCY
from cosyclone.talker.request import DecodeOptions, TalkerRequest, prompt_batch
from cosyclone.talker.sampler import SamplerOptions
from cosyclone.talker.slot_sampler import SlotSampler, legacy_generator
from cosyclone.talker.step import Admit, HostRead, PendingHarvest, SlotStep, StepKey, to_device

if TYPE_CHECKING:  # annotations only
    from cosyclone.talker.sequence import Seq


class Flags:
    """One window's finished flags on their way to the host, and what each slot held then.

    On CUDA the copy goes to pinned memory without blocking, with an event to wait on when it is
    read (by then the next window is queued, so the device never idles on the host).
    """

    def __init__(self, running: Tensor, held: Sequence[object | None], *, keep: bool) -> None:
        """``keep``: the flags are read after more steps ran, so take a copy of them now."""
        self.held = list(held)
        self.host = HostRead(running, clone=keep)

    def read(self) -> list[bool]:
        return self.host.tolist()


class StepRunner:
    """Owns the slot step (model, cache, per-slot state, sampler) and how it runs."""

    def __init__(self, model: CosyVoice3LM, options: DecodeOptions, *, slots: int, capacity: int,
                 token_capacity: int) -> None:
        self.model, self.options = model, options
        self.n_slots = max(1, int(slots))
        self.sampler_options: SamplerOptions = options.sampler or SamplerOptions.from_config(
            model.cfg.sampling
        )
        mech = options.mechanics
        if mech.capacity is not None:
            capacity = mech.capacity
        reserve = options.reserve_positions or 0  # the sized cells, graphs or not (the eager fallback too)
        capacity, token_capacity = max(1, capacity, reserve), max(1, token_capacity, reserve)
        self.graphs = self._choice()
        self.pooled: PooledStep | None = None  # with graphs: the process's step, borrowed until close()
        self.graphed: GraphedStep | None = None
        self.engine: SlotStep
        if self.graphs.enabled:
            self.pooled = PROCESS.acquire(model, (self.n_slots, self.sampler_options), self._new_step,
                                          capacity=capacity, token_capacity=token_capacity)
            self._release = weakref.finalize(self, PROCESS.release, self.pooled)  # also if never closed
            self.engine = self.pooled.step
            self.graphed = self.pooled.graphed
        else:
            self.engine = self._new_step(capacity, token_capacity)
        self.step_fn: Callable[[StepKey], None] = self.engine.step if self.graphed is None else self.graphed
        if mech.compile:
            self.step_fn = torch.compile(self.engine.step, fullgraph=True, backend=mech.compile)
        lagged = mech.lagged_reads
        self.lagged = model.device.type == "cuda" if lagged is None else bool(lagged)
        cpu = model.device.type == "cpu"
        self.sync_every = max(1, mech.sync_every or (1 if cpu else 4))
        fuse = mech.fused_admission
        self.fuse = cpu and not mech.compile and self.graphed is None if fuse is None else bool(fuse)
        self.graphs_captured = 0  # by graph sets dropped when the engine grew
        self.graphs_replayed = 0  # likewise
        # the pooled step's counts when this runner took it: what it did itself is the difference
        self._captured0 = self.graphed.captured if self.graphed is not None else 0
        self._replayed0 = self.graphed.replayed if self.graphed is not None else 0

    def _new_step(self, capacity: int, token_capacity: int) -> SlotStep:
        """A slot step of this runner's shape (its own sampler; with graphs, the pool keeps it)."""
        cfg = self.model.cfg
        sampler = SlotSampler(self.sampler_options, slots=self.n_slots, vocab=cfg.decoder_size,
                              speech_token_size=cfg.speech_token_size, device=self.model.device)
        return SlotStep(self.model, slots=self.n_slots, capacity=capacity, token_capacity=token_capacity,
                        sampler=sampler)

    def _choice(self) -> GraphChoice:
        """Resolve ``cuda_graphs``: on routes the step through the process's pooled, per-``kv_len``
        graphs; off for good once a capture failed in the process."""
        opts = self.options
        choice = resolve_cuda_graphs(opts.cuda_graphs, self.model.device, draw=self.sampler_options.draw,
                                     compile=opts.mechanics.compile, anywhere=PROCESS.capture_anywhere)
        if choice.enabled and PROCESS.disabled is not None:
            return GraphChoice(False, f"off for this process since a capture failed: {PROCESS.disabled}")
        return choice

    # -- cache ---------------------------------------------------------------------------------------

    def fit(self, need: int, need_tokens: int) -> None:
        """Grow the cache to ``need`` cells and the token buffer to ``need_tokens`` per slot."""
        eng = self.engine
        if need <= eng.capacity and need_tokens <= eng.token_capacity:
            return
        if self.options.mechanics.capacity is not None and need > eng.capacity:
            raise ValueError(f"capacity {eng.capacity} is below a row's prompt + max_len ({need})")

        def grown(need: int, have: int, bucket: int = 1) -> int:
            """``have`` if it suffices, else at least 1.5x it (a few growths per manifest), bucketed."""
            return have if need <= have else -(-max(need, have + have // 2) // bucket) * bucket

        if eng.grow(grown(need, eng.capacity, self.options.mechanics.kv_bucket or 1),
                    grown(need_tokens, eng.token_capacity)):
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

    def kv_len(self, bound: int) -> int | None:
        """Cells the next window reads, given the furthest position ``bound`` it reaches (bucketed)."""
        bucket = self.options.mechanics.kv_bucket
        if not bucket:
            return None
        return min(self.engine.capacity, -(-bound // bucket) * bucket)

    # -- rows in and out -----------------------------------------------------------------------------

    def prefill(self, newcomers: Sequence[Seq], *, ride_along: bool) -> Admit | None:
        """Prefill ``newcomers`` (each in the slot the scheduler gave it) into their slots, and start
        them (:meth:`started`): now, or (``ride_along`` with fused admission) returned as the next
        step's :class:`Admit` (:meth:`window` starts them once its step has prefilled them)."""
        slots = [_slot(s) for s in newcomers]
        embeds, lengths = prompt_batch(self.model, [_request(s) for s in newcomers])
        max_len = [s.max_len for s in newcomers]
        if self.fuse and ride_along:
            return Admit(slots=slots, embeds=embeds, lengths=lengths, max_len=max_len)
        self.engine.admit(slots, embeds, lengths, max_len)
        self.started(newcomers)
        return None

    def started(self, newcomers: Sequence[Seq]) -> None:
        """The in-step sampler's state for segments just prefilled into their slots."""
        sampler = self.engine.sampler
        if sampler is None:
            return
        dev = self.model.device
        slots = [_slot(s) for s in newcomers]
        keys, min_len = [s.key for s in newcomers], [s.min_len for s in newcomers]
        sampler.reset(to_device(slots, dev), to_device(keys, dev), to_device(min_len, dev))
        if sampler.options.draw == "legacy-multinomial":
            for slot, s in zip(slots, newcomers, strict=True):
                req = _request(s)
                sampler.generators[slot] = legacy_generator(req.seed, req.segment, s.key, dev)

    def move(self, moves: Sequence[tuple[int, int]]) -> None:
        """Rows go on in lower free slots ((from, to) pairs, the scheduler's :meth:`compact`)."""
        for src, dst in moves:
            self.engine.move(src, dst)
        if moves:
            PROCESS_OCCUPANCY.moved(len(moves))

    def window(
        self, admit: Admit | None, newcomers: Sequence[Seq], kv_len: int | None, *, bucket: int | None = None,
        live: int = 0
    ) -> tuple[float, int]:
        """``sync_every`` steps (the first carrying ``admit``, the prefill of the segments
        ``newcomers``, which it starts after that step) over the first ``bucket`` slots (None: all;
        every running row and newcomer is below it); ``live``: rows running, for the tally.
        Returns (seconds, steps replayed)."""
        t0 = time.perf_counter()
        if self.options.mechanics.compile:  # one compiled shape: every slot, whatever runs
            bucket = None
        key = self.engine.shape_key(bucket, kv_len)
        PROCESS_OCCUPANCY.add(steps=self.sync_every, live=live,
                              bucket=min(bucket or self.n_slots, self.n_slots))
        replayed = 0
        for _ in range(self.sync_every):
            if admit is not None:
                self.engine.step(key, admit)  # eager: a step that admits has its own shapes
                self.started(newcomers)
                admit = None
            else:
                self.step_fn(key)
                replayed += self.graphed is not None and self.graphed.last_replayed
        return time.perf_counter() - t0, replayed

    def flags(self, held: Sequence[object | None]) -> Flags:
        """This window's finished flags, copied now (kept when they are read a window later)."""
        return Flags(self.engine.state.running, held, keep=self.lagged)

    def harvest_start(self, slots: Sequence[int]) -> PendingHarvest:
        return self.engine.harvest_start(slots)

    # -- graphs and the end --------------------------------------------------------------------------

    def graph_report(self) -> tuple[GraphChoice, int]:
        """The graph choice as the decode ended and the graphs this runner captured."""
        if self.graphed is None:
            return self.graphs, 0
        captured = self.graphs_captured + self.graphed.captured - self._captured0
        if self.graphed.reason is not None:
            return GraphChoice(False, self.graphed.reason), captured
        return self.graphs, captured

    @property
    def graphs_used(self) -> bool:
        """True once a decode step really ran as a replayed CUDA graph."""
        mine = self.graphed.replayed - self._replayed0 if self.graphed is not None else 0
        return self.graphs_replayed + mine > 0

    def close(self) -> None:
        """Its own cache goes, or the pooled step goes back to the process (cache and graphs kept)."""
        if self.pooled is not None:
            self._release()  # once: the finalizer does nothing after this
        else:
            self.engine.free_cells()  # the cells go; a closed runner is done


def _slot(seq: Seq) -> int:
    """The slot a segment being started holds (the scheduler gave it one)."""
    assert seq.slot is not None, f"segment {seq.ticket} holds no slot"
    return seq.slot


def _request(seq: Seq) -> TalkerRequest:
    """A segment's request while it decodes (dropped only once its result was returned)."""
    assert seq.request is not None, f"ticket {seq.ticket} was already returned"
    return seq.request
