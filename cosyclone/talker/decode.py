"""Talker decoding as a small scheduler over a fixed-capacity slot KV cache (continuous batching).

Why this shape: the decode step (:class:`~cosyclone.talker.engine.SlotEngine`) has fixed shapes
whatever rows are active, so it can be compiled or graph-captured, and a freed slot is refilled at
once: with ``DecodeOptions.slots`` smaller than the number of requests, the next request is
prefilled into a slot as soon as one finishes, instead of the batch waiting for its longest row.
Newcomers are prefilled apart from the decode steps, right-padded with their own positions and key
masks, so every row computes what it would alone (the same tokens; logits equal up to fp32
rounding of a different kernel shape). The host reads the finished flags every
``DecodeOptions.sync_every`` steps; tokens, stop flags, length rules and diagnostic counters stay
on the device in between.

By default the RAS sampler runs inside the step (:mod:`cosyclone.talker.slot_sampler`); a
``custom_sampler`` (anything that satisfies :class:`TokenSampler`: the greedy, forced and
reference samplers of tests/samplers.py) runs on the host between steps instead. Each request carries its
row's seed, already derived once by the caller (manifest ``seed``, else ``row_seed(--seed, id)``),
and its segment index; the sampler draws from ``stream_key(seed, segment)`` and reports that seed
unchanged. Nothing here hashes the seed again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from .model import CosyVoice3LM

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .graphs import CaptureBackend, GraphChoice
    from .sampler import SamplerOptions

#: FSQ codes of silence/breath (spec 1.5); runs longer than MAX_SILENT are dropped from ``tokens``.
SILENT_TOKENS: frozenset[int] = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
MAX_SILENT = 5

LogitsHook = Callable[[Tensor, Tensor, int], Tensor]


class TokenSampler(Protocol):
    """What :func:`generate` needs from a custom sampler (see tests/samplers.py)."""

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """``logits`` (b, V) fp32, ``rows`` (b,) original-row indices -> (tokens (b,), aborted (b,))."""
        ...

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        """One diagnostics object (or None) per original row."""
        ...


@dataclass(frozen=True)
class TalkerRequest:
    """One row to decode."""

    row_id: str  # stable id: names the diagnostics
    text_ids: Tensor  # (L,) int64: prompt text ids ++ target text ids
    target_len: int  # number of target text ids (min/max length are ratios of this)
    prompt_speech_tokens: Tensor  # (P,) int64 prompt speech tokens (may be empty)
    seed: int = 0  # the row's seed, used as given (the noise stream is stream_key(seed, segment))
    segment: int = 0  # index of this text segment within its row: each segment gets its own noise stream


@dataclass(frozen=True)
class DecodeOptions:
    """How :func:`generate` decodes."""

    sampler: SamplerOptions | None = None  # RAS options; None = SamplerOptions.from_config(model.cfg.sampling)
    custom_sampler: TokenSampler | None = None  # overrides ``sampler`` (tests/samplers.py: greedy, forced, reference)
    silent_filter: bool = True  # drop silent ids after MAX_SILENT consecutive ones from ``tokens``
    max_len_override: int | None = None  # cap on generated tokens per row instead of int(20 * target_len)
    min_len_override: int | None = None  # stop ids blocked below this many tokens instead of int(2 * target_len)
    min_len_ratio: float | None = None  # min tokens = int(ratio * target_len); None = the model's (official 2)
    max_len_ratio: float | None = None  # max tokens = int(ratio * target_len); None = the model's (official 20)
    logits_hook: LogitsHook | None = None  # (logits (b,V), rows (b,), step) -> logits; fault injection
    slots: int | None = None  # rows decoded at once; more requests wait and take a slot as one frees (None: all)
    sync_every: int = 4  # steps between host reads of the finished flags
    kv_bucket: int | None = 64  # cells a step reads, rounded up to this (None: the whole capacity, fixed shape)
    capacity: int | None = None  # cache cells per slot (None: longest prompt + largest max_len)
    compile: str | None = None  # torch.compile backend for the step ("inductor", "eager", ...; fullgraph=True);
    # use with kv_bucket=None (one shape) and a fixed capacity; ignored with a custom sampler or logits hook
    cuda_graphs: str = "auto"  # "auto": capture the step as CUDA graphs (one per kv_len bucket) on CUDA/ROCm
    # when it can be captured (see graphs.resolve_cuda_graphs), eager otherwise; "off": always eager
    graph_backend: CaptureBackend | None = None  # tests: capture with this (graphs.EagerCapture on CPU)
    on_graphs: Callable[[GraphChoice, int], None] | None = None  # told once per call: the choice as the decode
    # ended (a failed capture: off, with the reason) and the number of graphs captured


@dataclass
class TalkerResult:
    """What one row produced."""

    row_id: str  # the request's row_id
    tokens: list[int]  # emitted speech tokens after the silent filter (what flow gets)
    raw_tokens: list[int]  # every emitted speech token (what the LLM was fed)
    stop_reason: str  # "eos" | "max_len" | "no_finite_logits" | "error"
    diagnostics: Any = None  # SamplerRowDiagnostics from the sampler (None for simple samplers)
    min_len: int = 0  # int(2 * target_len)
    max_len: int = 0  # int(20 * target_len) or the override


# ---------------------------------------------------------------------------------------------
# Silent-token filter


def silent_filter(tokens: Sequence[int], silent: frozenset[int] = SILENT_TOKENS,
                  max_run: int = MAX_SILENT) -> list[int]:
    """Keep a silent id while the current run of consecutive silent ids is <= ``max_run``."""
    kept: list[int] = []
    run = 0
    for t in tokens:
        if t in silent:
            run += 1
            if run > max_run:
                continue
        else:
            run = 0
        kept.append(t)
    return kept


# ---------------------------------------------------------------------------------------------
# Decoding


def prompt_length(request: TalkerRequest) -> int:
    """Length of a request's assembled input: sos, text ids, task id, prompt speech tokens."""
    return int(request.text_ids.numel()) + int(request.prompt_speech_tokens.numel()) + 2


def _prompt_batch(model: CosyVoice3LM, requests: Sequence[TalkerRequest]) -> tuple[Tensor, Tensor]:
    """Right-padded assembled inputs (B, T, D) and their lengths (B,) int64 on the model device."""
    rows = [model.assemble(r.text_ids.reshape(-1).long(), r.prompt_speech_tokens.reshape(-1).long())
            for r in requests]
    lengths = torch.tensor([x.shape[0] for x in rows], dtype=torch.int64, device=model.device)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), lengths


class _Scheduler:
    """Host side of one :func:`generate` call: which request sits in which slot, admission of the
    next pending request into a free slot, reading finished slots. It never needs a device value
    to know a slot's position: a row admitted at global step a has taken g - a draws at step g."""

    def __init__(self, model: CosyVoice3LM, requests: Sequence[TalkerRequest], options: DecodeOptions,
                 min_len: list[int], max_len: list[int]) -> None:
        from .engine import SlotEngine  # lazy: the engine imports the sampler modules
        from .sampler import SamplerOptions, stream_key
        from .slot_sampler import SlotSampler

        self.model, self.requests, self.options = model, requests, options
        self.min_len, self.max_len = min_len, max_len
        n = len(requests)
        self.plen = [prompt_length(r) for r in requests]
        self.n_slots = max(1, min(n, options.slots or n))
        capacity = options.capacity or (max(self.plen) + max(1, max(max_len)))
        if capacity < max(p + m for p, m in zip(self.plen, max_len, strict=True)):
            raise ValueError(f"capacity {capacity} is below a row's prompt + max_len")
        self.capacity = capacity
        self.sampler_options = None
        sampler = None
        if options.custom_sampler is None:
            self.sampler_options = options.sampler or SamplerOptions.from_config(model.cfg.sampling)
            sampler = SlotSampler(self.sampler_options, slots=self.n_slots, vocab=model.cfg.decoder_size,
                                  speech_token_size=model.cfg.speech_token_size, device=model.device)
        self.keys = [stream_key(r.seed, r.segment) for r in requests]
        self.engine = SlotEngine(model, slots=self.n_slots, capacity=capacity,
                                 token_capacity=max(1, max(max_len)), sampler=sampler)
        self.slot_row: list[int | None] = [None] * self.n_slots
        self.admitted_at = [0] * self.n_slots
        self.g = 0  # global step
        self.pending = deque(i for i in range(n) if max_len[i] > 0)
        self.done: dict[int, Any] = {}  # request index -> Harvest
        self.host_steps = options.custom_sampler is not None or options.logits_hook is not None
        step = self.engine.step
        self.step_fn: Callable[[], None] = step
        if options.compile:
            self.step_fn = torch.compile(step, fullgraph=True, backend=options.compile)
        self.graphs, self.graphed = self._graphs(step)

    def _graphs(self, step: Callable[[], None]) -> tuple[GraphChoice, Any]:
        """Resolve ``cuda_graphs`` and, when on, route the step through per-``kv_len`` graphs."""
        from .graphs import CudaGraphCapture, GraphedStep, resolve_cuda_graphs

        opts = self.options
        draw = self.sampler_options.draw if self.sampler_options is not None else "race"
        choice = resolve_cuda_graphs(opts.cuda_graphs, self.model.device, draw=draw, host_steps=self.host_steps,
                                     compile=opts.compile, backend=opts.graph_backend)
        if not choice.enabled:
            return choice, None
        backend = opts.graph_backend or CudaGraphCapture(self.model.device)
        graphed = GraphedStep(step, key=lambda: self.engine._kv_len, backend=backend)
        self.step_fn = graphed
        return choice, graphed

    def graph_report(self) -> tuple[GraphChoice, int]:
        """The graph choice as the decode ended and the graphs captured."""
        from .graphs import GraphChoice

        if self.graphed is None:
            return self.graphs, 0
        if self.graphed.reason is not None:
            return GraphChoice(False, self.graphed.reason), self.graphed.captured
        return self.graphs, self.graphed.captured

    def admit(self) -> None:
        """Fill free slots (lowest first) with the next pending requests, prefilled together."""
        free = [s for s, r in enumerate(self.slot_row) if r is None]
        take = [(s, self.pending.popleft()) for s in free[:len(self.pending)]]
        if not take:
            return
        slots, rows = [s for s, _ in take], [r for _, r in take]
        embeds, lengths = _prompt_batch(self.model, [self.requests[r] for r in rows])
        self.engine.admit(slots, embeds, lengths, [self.max_len[r] for r in rows])
        sampler = self.engine.sampler
        if sampler is not None:
            dev = self.model.device
            sampler.reset(torch.tensor(slots, device=dev), torch.tensor([self.keys[r] for r in rows], device=dev),
                          torch.tensor([self.min_len[r] for r in rows], device=dev))
            if sampler.options.draw == "legacy-multinomial":
                from .slot_sampler import legacy_generator

                for s, r in take:
                    req = self.requests[r]
                    sampler.generators[s] = legacy_generator(req.seed, req.segment, self.keys[r], dev)
        for s, r in take:
            self.slot_row[s] = r
            self.admitted_at[s] = self.g

    def _kv_len(self, window: int) -> int | None:
        """Cells the next ``window`` steps read: a bucketed bound on every slot's position."""
        bucket = self.options.kv_bucket
        if not bucket:
            return None
        bound = max(self.plen[r] + self.g - self.admitted_at[s] + window
                    for s, r in enumerate(self.slot_row) if r is not None)
        return min(self.capacity, -(-bound // bucket) * bucket)

    def _host_step(self) -> None:
        """A step whose draw or logits pass through Python (custom sampler, logits hook)."""
        eng, opts = self.engine, self.options
        st = eng.state
        running = st.running.tolist()
        groups: dict[int, list[int]] = {}
        for s, r in enumerate(self.slot_row):
            if r is not None and running[s]:
                groups.setdefault(self.g - self.admitted_at[s], []).append(s)
        dev = self.model.device
        tokens = torch.zeros(self.n_slots, dtype=torch.int64, device=dev)
        aborted = torch.zeros(self.n_slots, dtype=torch.bool, device=dev)
        for step, slots in sorted(groups.items()):
            idx = torch.tensor(slots, dtype=torch.int64, device=dev)
            rows = torch.tensor([self.slot_row[s] for s in slots], dtype=torch.int64, device=dev)
            if opts.logits_hook is not None:
                st.logits[idx] = opts.logits_hook(st.logits[idx], rows, step)
            if opts.custom_sampler is not None:
                tok, ab = opts.custom_sampler.sample(st.logits[idx], rows, step)
                tokens[idx], aborted[idx] = tok.long().to(dev), ab.bool().to(dev)
        if opts.custom_sampler is not None:
            eng.advance(tokens, aborted)
        else:
            eng.step()

    def run(self) -> None:
        """Decode until every request has finished."""
        self.admit()
        while any(r is not None for r in self.slot_row):
            window = 1 if self.host_steps else max(1, self.options.sync_every)
            self.engine._kv_len = self._kv_len(window)
            for _ in range(window):
                if self.host_steps:
                    self._host_step()
                else:
                    self.step_fn()
                self.g += 1
            running = self.engine.state.running.tolist()  # the one read per window
            finished = [s for s, r in enumerate(self.slot_row) if r is not None and not running[s]]
            if finished:
                for s, h in zip(finished, self.engine.harvest(finished), strict=True):
                    self.done[self.slot_row[s]] = h  # type: ignore[index]
                    self.slot_row[s] = None
            self.admit()


@torch.no_grad()
def generate(model: CosyVoice3LM, requests: Sequence[TalkerRequest],
             options: DecodeOptions | None = None) -> list[TalkerResult]:
    """Decode every request, ``options.slots`` at a time (default: all at once); results are in
    request order and do not depend on the slot count or the admission order."""
    from .engine import REASONS
    from .sampler import COUNTER_NAMES, row_diagnostics

    options = options or DecodeOptions()
    if not requests:
        return []
    cfg = model.cfg
    min_ratio = cfg.min_len_ratio if options.min_len_ratio is None else options.min_len_ratio
    max_ratio = cfg.max_len_ratio if options.max_len_ratio is None else options.max_len_ratio
    min_len = [options.min_len_override if options.min_len_override is not None
               else int(min_ratio * r.target_len) for r in requests]
    max_len = [options.max_len_override if options.max_len_override is not None
               else int(max_ratio * r.target_len) for r in requests]
    sched = _Scheduler(model, requests, options, min_len, max_len)
    try:
        sched.run()
    finally:
        model.clear_cache()
    if options.on_graphs is not None:
        options.on_graphs(*sched.graph_report())

    raw = [sched.done[i].tokens if i in sched.done else [] for i in range(len(requests))]
    reasons = [REASONS[sched.done[i].reason] if i in sched.done else "max_len" for i in range(len(requests))]
    kept = [silent_filter(t) if options.silent_filter else list(t) for t in raw]
    if options.custom_sampler is not None:
        diags = options.custom_sampler.finish([None if x == "aborted" else x for x in reasons],
                                              [len(k) for k in kept])
    else:
        assert sched.sampler_options is not None
        never = [0] * len(COUNTER_NAMES) + [0, -1, 0, 0]  # a request with max_len <= 0 never takes a slot
        diags = []
        for i, req in enumerate(requests):
            state = sched.done[i].sampler_state if i in sched.done else never
            counters, err = state[:-4], state[-4:]
            diags.append(row_diagnostics(sched.sampler_options, req.row_id, req.seed, req.segment, counters,
                                         dead=reasons[i] == "aborted", err=err,
                                         stop_reason=None if reasons[i] == "aborted" else reasons[i],
                                         tokens_emitted=len(kept[i])))
    results: list[TalkerResult] = []
    for r, req in enumerate(requests):
        d = diags[r] if diags else None
        reason = reasons[r]
        if reason == "aborted":
            reason = getattr(d, "stop_reason", None) or "error"
        results.append(TalkerResult(row_id=req.row_id, tokens=kept[r], raw_tokens=raw[r], stop_reason=reason,
                                    diagnostics=d, min_len=min_len[r], max_len=max_len[r]))
    return results
