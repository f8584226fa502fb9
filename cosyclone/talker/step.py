"""The decode step: a fixed number of slots, a fixed-shape step, rows entering and leaving slots.

Why: on a GPU the talker's speed is set by the host work of each step, not by the weights. A
step whose shapes never change (slots x capacity, whatever rows are running) and that needs no
host value launches the same kernels every time, so it can be compiled once
(``torch.compile(fullgraph=True)``) or captured as a CUDA graph, and a finished row's slot can be
handed to the next row of the manifest at once (continuous batching, scheduled by
:func:`cosyclone.talker.decode.generate`).

One step, all on the device (:meth:`SlotStep.step`): draw a token per slot from the logits
the previous forward left in :attr:`SlotState.logits` (:class:`SlotSampler`), apply the stop
rules (stop id, sampler abort, max length) and record the token, then feed every slot's token
through the model at its own position and keep the new logits. The step runs over the first
``_bucket`` slots (the smallest bucket that holds every running row, :meth:`SlotStep.bucket_view`);
slots inside it that are not running compute too (fixed shape) but change nothing that is read.
The host reads ``running`` every few steps and, when a slot has finished, its tokens and counters,
in one read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from cosyclone.talker.kv_cache import SlotKVCache
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.slot_sampler import SlotSampler
from cosyclone.talker.slot_views import move_slot, narrowed

#: Per-slot ``reason`` codes (0 = still running or never used).
RUNNING, EOS, MAX_LEN, ABORTED = 0, 1, 2, 3
REASONS = {EOS: "eos", MAX_LEN: "max_len", ABORTED: "aborted"}

#: A step's shape (:meth:`SlotStep.shape_key`): (slots computed, cache cells read; None: the capacity).
StepKey = tuple[int, int | None]


def to_device(
    values: Sequence[int] | Tensor, device: torch.device | str, dtype: torch.dtype = torch.int64
) -> Tensor:
    """Host values (ints or a CPU tensor) on ``device`` without making the host wait.

    On CUDA a copy from pageable memory first waits for the stream to drain, so a scheduler that
    admits rows while steps are queued would stall on every admission; from pinned memory the copy
    is queued like a kernel (the pinned block is kept until the copy has run)."""
    dev = torch.device(device)
    t = values if isinstance(values, Tensor) else torch.tensor(list(values), dtype=dtype)
    if dev.type != "cuda" or t.device.type != "cpu":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


class HostRead:
    """A device tensor on its way to the host: the copy is queued now, the values read later.

    On CUDA the copy goes to pinned memory without blocking and an event marks its end, so
    :meth:`tolist` waits for that copy only, not for the steps queued after it. On CPU the tensor
    is kept as it is (``clone`` when the caller changes it before the read)."""

    def __init__(self, t: Tensor, *, clone: bool = False) -> None:
        self.event: Any = None
        self.host = t
        if t.device.type == "cuda":
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.event.record()
        elif clone:
            self.host = t.clone()

    def tolist(self) -> list[Any]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class SlotState(nn.Module):
    """Per-slot decode state (registered buffers, (slots, ...) shapes)."""

    # registered buffers (non-persistent), typed for the checker
    logits: Tensor
    steps: Tensor
    n_emit: Tensor
    max_len: Tensor
    reason: Tensor
    running: Tensor
    tokens: Tensor

    #: every buffer is per slot, first dimension (slot_views: a bucket's views, a row's move)
    SLOT_DIMS = {name: 0 for name in ("logits", "steps", "n_emit", "max_len", "reason", "running", "tokens")}

    def __init__(self, slots: int, token_capacity: int, vocab: int, device: torch.device | str) -> None:
        super().__init__()
        i64: dict[str, Any] = {"dtype": torch.int64, "device": device}
        buf = self.register_buffer
        buf("logits", torch.zeros(slots, vocab, dtype=torch.float32, device=device), persistent=False)
        buf("steps", torch.zeros(slots, **i64), persistent=False)  # draws taken (the sampler's step)
        buf("n_emit", torch.zeros(slots, **i64), persistent=False)  # speech tokens recorded
        buf("max_len", torch.zeros(slots, **i64), persistent=False)
        buf("reason", torch.zeros(slots, **i64), persistent=False)  # RUNNING / EOS / MAX_LEN / ABORTED
        buf("running", torch.zeros(slots, dtype=torch.bool, device=device), persistent=False)
        buf("tokens", torch.zeros(slots, token_capacity, **i64), persistent=False)  # recorded tokens


@dataclass
class Harvest:
    """What one finished slot produced, read to the host once."""

    reason: int  # EOS / MAX_LEN / ABORTED
    tokens: list[int]
    sampler_state: list[int]  # SlotSampler.state_rows() row: counters then error record (device sampler only)


@dataclass
class PendingHarvest:
    """Finished slots' values on their way to the host (:meth:`SlotStep.harvest_start`)."""

    read: HostRead  # rows of [reason, n_emit, tokens (cap), sampler state]
    cap: int  # token cells per row when the read was queued

    def harvests(self) -> list[Harvest]:
        """One :class:`Harvest` per slot, in the order asked (waits for this copy only)."""
        cap = self.cap
        return [Harvest(reason=int(r[0]), tokens=[int(t) for t in r[2:2 + int(r[1])]],
                        sampler_state=[int(v) for v in r[2 + cap:]]) for r in self.read.tolist()]


class SlotStep(nn.Module):
    """The model's slot cache, the per-slot state and (optionally) the in-step sampler."""

    # registered buffers (non-persistent), typed for the checker

    def __init__(self, model: CosyVoice3LM, *, slots: int, capacity: int, token_capacity: int,
                 sampler: SlotSampler | None) -> None:
        super().__init__()
        self.model = model
        self.n_slots = int(slots)
        self.cache: SlotKVCache = model.new_cache(slots, capacity)  # this engine's own cells
        self.state = SlotState(slots, token_capacity, model.cfg.decoder_size, model.device)
        self.sampler = sampler
        self.speech_token_size = model.cfg.speech_token_size
        self._views: dict[int, SlotStep] = {}  # bucket -> the step over its first slots (bucket_view)

    # -- host side ----------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Cache cells per slot (prompt plus generated tokens)."""
        return self.cache.capacity

    @property
    def token_capacity(self) -> int:
        """Speech tokens a slot can record."""
        return int(self.state.tokens.shape[1])

    def grow(self, capacity: int, token_capacity: int) -> bool:
        """Make room for longer rows (a session that spans a manifest meets them as it goes).

        New cache and token buffers of at least the sizes asked for, holding everything the old ones
        held (running slots go on unchanged: cells past a slot's length are never read). Returns
        whether anything was reallocated; a captured step refers to the old buffers, so the caller
        captures again after a growth.
        """
        capacity, token_capacity = max(capacity, self.capacity), max(token_capacity, self.token_capacity)
        if capacity == self.capacity and token_capacity == self.token_capacity:
            return False
        old = self.cache
        new = self.model.new_cache(self.n_slots, capacity)
        new.k[..., :old.capacity, :].copy_(old.k)
        new.v[..., :old.capacity, :].copy_(old.v)
        new.lengths.copy_(old.lengths)
        self.cache = new
        st = self.state
        tokens = torch.zeros(self.n_slots, token_capacity, dtype=st.tokens.dtype, device=st.tokens.device)
        tokens[:, :st.tokens.shape[1]] = st.tokens
        st.tokens = tokens
        self._views.clear()  # they viewed the old buffers
        return True

    def free_cells(self) -> None:
        """Let the cache's cells go (a closed runner's own step): one cell left, no view kept."""
        self._views.clear()
        self.cache = self.model.new_cache(self.n_slots, 1)

    def bucket_view(self, n: int) -> SlotStep:
        """The step over slots ``0..n-1`` only: the same model, views of this step's buffers.

        Why: a step costs what the slots it computes cost, so a step over the smallest bucket that
        holds every running row follows the live rows (:mod:`.slot_views`); the views start at the
        same addresses, so a graph captured on one stays valid while this step's buffers live."""
        if n >= self.n_slots:
            return self
        view = self._views.get(n)
        if view is None:
            view = SlotStep.__new__(SlotStep)
            nn.Module.__init__(view)
            view.model, view.n_slots, view.speech_token_size = self.model, n, self.speech_token_size
            view.cache = narrowed(self.cache, n)
            view.state = narrowed(self.state, n)
            view.sampler = None if self.sampler is None else narrowed(self.sampler, n)
            view._views = {}
            self._views[n] = view
        return view

    def move(self, src: int, dst: int) -> None:
        """The row in slot ``src`` goes on in the free slot ``dst``: its cache cells, length, state
        and sampler state are copied (the draws it makes next do not depend on its slot), and
        ``src`` stops running. Why: a long row left alone in a high slot would keep every step
        over the largest bucket (:meth:`~cosyclone.talker.scheduler.SlotScheduler.compact`)."""
        parts: list[nn.Module] = [self.cache, self.state]
        if self.sampler is not None:
            parts.append(self.sampler)
            self.sampler.generators[dst] = self.sampler.generators[src]
        for part in parts:
            move_slot(part, src, dst)
        self.state.running[src] = False

    def admit(self, slots: Sequence[int], embeds: Tensor, lengths: Tensor, max_len: Sequence[int]) -> None:
        """Prefill new rows (right-padded ``embeds`` (b, T, D), ``lengths`` (b,)) into ``slots``."""
        idx = to_device(slots, self.model.device)
        self.state.logits[idx] = self.model.prefill(embeds, lengths, idx, cache=self.cache)
        self._start(idx, max_len)

    def _start(self, idx: Tensor, max_len: Sequence[int]) -> None:
        """Slots ``idx`` (b,), whose prompts' logits are in place, begin their rows: nothing drawn yet."""
        st = self.state
        st.steps[idx] = 0
        st.n_emit[idx] = 0
        st.reason[idx] = RUNNING
        st.max_len[idx] = to_device(max_len, idx.device)
        st.running[idx] = True

    def harvest(self, slots: Sequence[int]) -> list[Harvest]:
        """Read finished ``slots``: reason, tokens and sampler counters, in one device read."""
        return self.harvest_start(slots).harvests()

    def harvest_start(self, slots: Sequence[int]) -> PendingHarvest:
        """Queue the read of finished ``slots``; :meth:`PendingHarvest.harvests` reads it.

        Queued before anything that could reuse the slots, so the values are the finished rows'
        even when the slots are refilled (or the engine grows) before the host reads them."""
        st = self.state
        idx = to_device(slots, st.tokens.device)
        parts = [st.reason[:, None], st.n_emit[:, None], st.tokens]
        if self.sampler is not None:
            parts.append(self.sampler.state_rows())
        return PendingHarvest(HostRead(torch.cat(parts, dim=1).index_select(0, idx)), int(st.tokens.shape[1]))

    # -- the step (device only: no host values, fixed shapes) ---------------------------------------

    def advance(self, tokens: Tensor, aborted: Tensor, admit: Admit | None = None,
                kv_len: int | None = None) -> None:
        """Stop rules and bookkeeping for one draw ``tokens``/``aborted`` (slots,), then the feed
        (which also prefills ``admit``'s newcomers into their free slots, see :class:`Admit`), each
        step reading ``kv_len`` cache cells (None: the capacity)."""
        st = self.state
        live = st.running
        stop_id = tokens >= self.speech_token_size
        emit = live & ~aborted & ~stop_id
        cell = st.n_emit.clamp(max=st.tokens.shape[1] - 1)[:, None]
        st.tokens.scatter_(1, cell, torch.where(emit, tokens, st.tokens.gather(1, cell)[:, 0])[:, None])
        st.n_emit.add_(emit.to(torch.int64))
        full = emit & (st.n_emit >= st.max_len)
        reason = torch.where(full, MAX_LEN, st.reason)
        reason = torch.where(live & ~aborted & stop_id, EOS, reason)
        st.reason.copy_(torch.where(live & aborted, ABORTED, reason))
        st.steps.add_(live.to(torch.int64))
        still = emit & ~full
        st.running.copy_(still)
        self._feed(tokens, still, admit, kv_len)

    def _feed(self, tokens: Tensor, still: Tensor, admit: Admit | None, kv_len: int | None) -> None:
        """Feed every slot's token at its position; rows that go on grow by one cell."""
        model = self.model
        cache = self.cache
        pos = cache.lengths.clamp(max=cache.capacity - 1)
        feed = model.embed_speech(tokens.clamp(0, model.cfg.decoder_size - 1))[:, None]
        if admit is None:
            self.state.logits.copy_(model.step(feed, pos, kv_len, cache=cache))
            cache.lengths.add_(still.to(torch.int64))
            return
        idx = to_device(admit.slots, tokens.device)
        # the newcomers' rows of these logits are their prompts' (model.step puts them there)
        self.state.logits.copy_(model.step(feed, pos, kv_len, cache=cache,
                                           admit=(admit.embeds, admit.lengths, idx)))
        # newcomers' slots were free: their lengths stay their prompts'
        cache.lengths.add_(still.to(torch.int64))
        self._start(idx, admit.max_len)

    def shape_key(self, bucket: int | None, kv_len: int | None) -> StepKey:
        """What a captured step's shape depends on: (slots computed, cells read), from the slots a
        step computes (``bucket``, None: all; every running row is below it) and the cache cells it
        reads (``kv_len``, None: the capacity)."""
        return (min(bucket or self.n_slots, self.n_slots), kv_len)

    def step(self, key: StepKey, admit: Admit | None = None) -> None:
        """One fused decode step with the in-step sampler of shape ``key`` (:meth:`shape_key`; what
        a graph captures, keyed by it; ``admit`` only eager)."""
        bucket, kv_len = key
        run = self.bucket_view(bucket)
        assert run.sampler is not None
        st = run.state
        tokens, aborted = run.sampler(st.logits, st.running, st.steps)
        run.advance(tokens, aborted, admit, kv_len)


@dataclass(frozen=True)
class Admit:
    """Rows to prefill into free slots during a step (:meth:`SlotStep.step`), instead of apart.

    On a CPU the step is bound by reading the weights; prompts that ride along in the same pass
    (:meth:`CosyVoice3LM.step` with ``admit``) cost their arithmetic only. The newcomers draw
    their first token at the next step; a step with nothing running has nothing to share, so the
    scheduler admits apart then (:meth:`SlotStep.admit`).
    """

    slots: Sequence[int]  # free slots (not running in this step)
    embeds: Tensor  # (b, T, D) right-padded prompts
    lengths: Tensor  # (b,) int64
    max_len: Sequence[int]  # per newcomer
