"""Decoding whose steps pass through Python: for tests and the talker bench, outside the product.

The product's step runs on the device from draw to feed (no host value, so it can be captured);
tests need to reach into it: inject NaN/+inf logits per row and step (fault injection through
the product's own in-step sampler), record each step's logits, or force tokens with a sampler of
their own (tests/samplers.py: greedy, forced, the per-call reference). :class:`HostSession` is
the product's :class:`~cosyclone.talker.decode.TalkerSession` with its engine's step wrapped:
before the step draws, ``logits_hook(logits (b, V), rows (b,), step)`` may replace the logits
the running rows draw from, and a ``sampler`` may draw instead of the in-step sampler. Everything
else (admission, fused prompts, growth, windows, lagged reads, harvests) is the product's own.

``rows`` are tickets (arrival order: with :func:`host_generate`, indices into its requests);
``step`` is the row's draw count (0 = the draw from its prompt's logits). Grouping is by step, in
increasing order, one hook or sampler call per group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

import torch
from torch import Tensor
from typing_extensions import override

from cosyclone.talker import DecodeOptions, TalkerRequest, TalkerResult, TalkerSession, decode
from cosyclone.talker.diagnostics import StopReason
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.results import harvest_tokens
from cosyclone.talker.step import Admit, SlotStep, StepKey

#: ``(logits (b, V) fp32, rows (b,) tickets, step) -> logits (b, V)``
LogitsHook = Callable[[Tensor, Tensor, int], Tensor]


class TokenSampler(Protocol):
    """A sampler that draws on the host (tests/samplers.py)."""

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """``logits`` (b, V) fp32, ``rows`` (b,) tickets -> (tokens (b,) int64, aborted (b,) bool)."""
        ...

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        """One diagnostics object (or None) per ticket, once every row has ended."""
        ...


class HostSession(TalkerSession):
    """A :class:`TalkerSession` whose every step runs ``logits_hook`` and/or ``sampler`` first.

    With a ``sampler`` its ``finish`` gives the diagnostics for every ticket at once, so the
    results returned by :meth:`poll` get their ``diagnostics`` (and an aborted row its stop
    reason) when the session is closed (:func:`decode.generate` closes it before returning).
    CUDA graphs are off: Python runs inside each step.
    """

    def __init__(self, model: CosyVoice3LM, options: DecodeOptions | None = None, *, slots: int,
                 capacity: int = 1, token_capacity: int = 1, sampler: TokenSampler | None = None,
                 logits_hook: LogitsHook | None = None) -> None:
        self.host_sampler, self.logits_hook = sampler, logits_hook
        self.returned: dict[int, TalkerResult] = {}
        self.aborted: set[int] = set()  # results the sampler aborted: their stop reason comes at close()
        # CUDA graphs off: Python runs inside each step, which a captured graph would not replay
        host = replace(options or DecodeOptions(), cuda_graphs="off")
        super().__init__(model, host, slots=slots, capacity=capacity, token_capacity=token_capacity)
        self.runner.engine.step = self._host_step  # type: ignore[method-assign]  # the admitting (eager) steps
        self.runner.step_fn = self._host_step  # the others (no compile, no graphs)

    def _host_step(self, key: StepKey, admit: Admit | None = None) -> None:
        eng = self.runner.engine
        st = eng.state
        running, steps = st.running.tolist(), st.steps.tolist()
        groups: dict[int, list[int]] = {}
        slot_row = [s.ticket if s is not None else None for s in self.scheduler.slots]  # tickets by slot
        for s, r in enumerate(slot_row):
            if r is not None and running[s]:
                groups.setdefault(steps[s], []).append(s)
        dev = st.logits.device
        tokens = torch.zeros(self.n_slots, dtype=torch.int64, device=dev)
        aborted = torch.zeros(self.n_slots, dtype=torch.bool, device=dev)
        for step, slots in sorted(groups.items()):
            idx = torch.tensor(slots, dtype=torch.int64, device=dev)
            rows = torch.tensor([slot_row[s] for s in slots], dtype=torch.int64, device=dev)
            if self.logits_hook is not None:
                st.logits[idx] = self.logits_hook(st.logits[idx], rows, step)
            if self.host_sampler is not None:
                tok, ab = self.host_sampler.sample(st.logits[idx], rows, step)
                tokens[idx], aborted[idx] = tok.long().to(dev), ab.bool().to(dev)
        if self.host_sampler is None:
            SlotStep.step(eng, key, admit)  # the product's in-step sampler draws from the (changed) logits
        else:
            eng.advance(tokens, aborted, admit, key[1])

    @override
    def _result(self, t: int) -> TalkerResult:
        if self.host_sampler is None:
            return super()._result(t)
        req = self._request(t)
        # "aborted" until close() asks the sampler why
        raw, kept, reason = harvest_tokens(self.seqs[t].harvest)
        seq = self.seqs[t]
        if reason == "aborted":  # the sampler says why at close()
            self.aborted.add(t)
        stop = "error" if reason == "aborted" else cast(StopReason, reason)
        res = TalkerResult(row_id=req.row_id, tokens=kept, raw_tokens=raw, stop_reason=stop,
                           min_len=seq.min_len, max_len=seq.max_len, seconds=seq.seconds)
        self.returned[t] = res
        return res

    @override
    def close(self) -> None:
        super().close()
        if self.host_sampler is None:
            return
        n = self.tickets  # every ticket handed out (returned ones leave the session)
        assert sorted(self.returned) == list(range(n)), "close() before every result was returned"
        ends = [self.returned[t] for t in range(n)]
        diags = self.host_sampler.finish(
            [None if t in self.aborted else r.stop_reason for t, r in enumerate(ends)],
            [len(r.tokens) for r in ends],
        )
        for t, (res, diag) in enumerate(zip(ends, diags or [None] * n, strict=True)):
            res.diagnostics = diag
            if t in self.aborted:
                res.stop_reason = getattr(diag, "stop_reason", None) or "error"


def host_generate(
    model: CosyVoice3LM,
    requests: Sequence[TalkerRequest],
    options: DecodeOptions | None = None,
    *,
    sampler: TokenSampler | None = None,
    logits_hook: LogitsHook | None = None,
) -> list[TalkerResult]:
    """The product's :func:`decode.generate` (its cache sizing, slots and checks) over a
    :class:`HostSession`: ``rows`` given to the hook and the sampler index ``requests``."""

    def session(*args: Any, **kw: Any) -> HostSession:
        return HostSession(*args, sampler=sampler, logits_hook=logits_hook, **kw)

    return decode.generate(model, requests, options, session_type=session)
