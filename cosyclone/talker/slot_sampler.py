"""RAS sampling inside the fixed-shape decode step: one row per cache slot, all state on the device.

Same rule, same numbers as ``BatchSampler`` in tests/samplers.py (the per-call reference the
tests compare it with, token for token and counter for counter), arranged so a
step can be captured: every tensor has the shape (slots, ...) whatever rows are running, rows
that are not running are masked out by ``live`` instead of being indexed away, each slot has
its own step counter as a device tensor (the noise counter and the min-length rule read it), the
nucleus comes from ``torch.topk`` instead of a sort of the whole vocabulary, and the counters
are one (9, slots) tensor updated by one add. The host touches this state only when a row enters
a slot (:meth:`SlotSampler.reset`) or leaves it (:meth:`SlotSampler.read`).

The sampler reads as a chain of small filters over the logits: raw statistics, the min-length
mask, the non-finite policy, the nucleus, the race draw, the repetition check.

The LEGACY ``draw="legacy-multinomial"`` keeps its per-row ``torch.multinomial`` loop (host
syncs; such a step cannot be captured and is only for comparisons with seeded official runs). It
has no reference copy in tests: tests/parity/test_sampling_parity.py checks its draws against the
official capture (the seeded draws exactly, the frequencies by chi-square).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from cosyclone.talker.sampler import (
    _DRAW_CONSTS,
    _ERR_EMPTY,
    _ERR_NONFINITE,
    _M32,
    COUNTER_NAMES,
    SamplerOptions,
    _vocab_hash,
    key_lanes,
    nucleus_keep,
    race_log_exp,
)

NEG_INF = float("-inf")

#: Counters gated by "the slot drew a token" (``ok``) rather than "the slot is running" (``live``).
_OK_GATED = ("tokens_emitted", "ras_fallbacks", "ras_sole_restores")


class Masked(NamedTuple):
    """Logits after the masks and the non-finite policy, and what the filters saw on the way."""

    x: Tensor  # (S, V) fp32: -inf = not a candidate; rows that abort hold anything (their draw is discarded)
    cand: Tensor  # (S, V) bool candidates (before the +inf rule)
    row_posinf: Tensor  # (S,) a +inf row: uniform over its +inf entries
    abort: Tensor  # (S,) no candidate (or, under "error", a NaN/+inf seen)


class SlotSampler(nn.Module):
    """Per-slot RAS sampler state (registered buffers) and the in-step draw."""

    # registered buffers (non-persistent), typed for the checker
    keys: Tensor
    min_len: Tensor
    hist: Tensor
    counters: Tensor
    err: Tensor
    vocab_hash: Tensor
    stop_cols: Tensor
    lanes: Tensor
    keys_hi: Tensor
    draw_consts: Tensor
    rank_tail: Tensor
    neg_inf: Tensor
    zero: Tensor
    stop_token: Tensor
    err_kind: Tensor
    stat_flip: Tensor
    ok_gated: Tensor

    #: per-slot buffers and the dimension of their slot (slot_views: a bucket's views, a row's move)
    SLOT_DIMS = {"keys": 0, "min_len": 0, "hist": 0, "counters": 1, "err": 1, "lanes": 2, "keys_hi": 0}

    def __init__(self, options: SamplerOptions, *, slots: int, vocab: int, speech_token_size: int,
                 device: torch.device | str) -> None:
        super().__init__()
        self.options = options
        self.speech_token_size = int(speech_token_size)
        i64: dict[str, Any] = {"dtype": torch.int64, "device": device}
        buf = self.register_buffer
        buf("keys", torch.zeros(slots, **i64), persistent=False)  # stream_key(seed, segment) per slot
        buf("min_len", torch.zeros(slots, **i64), persistent=False)
        # last tokens, -1 = none
        buf("hist", torch.full((slots, options.win_size), -1, **i64), persistent=False)
        buf("counters", torch.zeros(len(COUNTER_NAMES), slots, **i64), persistent=False)
        buf("err", torch.zeros(4, slots, **i64), persistent=False)  # kind, step (-1 = none), n_nan, n_posinf
        buf("vocab_hash", _vocab_hash(vocab, torch.device(device)), persistent=False)
        cols = torch.arange(vocab, device=device)
        S = self.speech_token_size
        # official-head: HEAD masks index speech_token_size (= sos in CosyVoice 3) only
        buf(
            "stop_cols",
            cols >= S if options.min_len_rule == "block-all-stop" else cols == S,
            persistent=False,
        )
        # Per-step constants live in buffers: a Python scalar in torch.where costs an extra op per call.
        # The noise key's lanes (set in reset; see race_log_exp) and the draw constants.
        buf("lanes", key_lanes(torch.zeros(slots, **i64)), persistent=False)
        buf("keys_hi", torch.zeros(slots, **i64), persistent=False)
        buf("draw_consts", torch.tensor(_DRAW_CONSTS, **i64)[:, None], persistent=False)
        # Top-k order key: probability bits, then the vocabulary index ascending (a strict total
        # order, what a stable descending sort gives); see _nucleus_draw.
        self._rank_shift = max(1, (vocab - 1).bit_length())
        buf("rank_tail", (1 << self._rank_shift) - 1 - cols, persistent=False)
        f32: dict[str, Any] = {"dtype": torch.float32, "device": device}
        buf("neg_inf", torch.tensor(NEG_INF, **f32), persistent=False)
        buf("zero", torch.tensor(0.0, **f32), persistent=False)
        buf("stop_token", torch.tensor(S, **i64), persistent=False)
        buf("err_kind", torch.tensor(_ERR_EMPTY, **i64), persistent=False)
        # _mask's row reductions: flip the rows that are "not any" (nan all, no candidate)
        buf("stat_flip", torch.tensor([False, True, False, True, False, False], device=device)[:, None],
            persistent=False)
        buf("ok_gated", torch.tensor([n in _OK_GATED for n in COUNTER_NAMES], device=device)[:, None],
            persistent=False)
        # count >= threshold <=> count >= this
        self.n_repeat = max(0, math.ceil(options.repetition_threshold))
        self.generators: list[torch.Generator | None] = [None] * slots  # LEGACY multinomial only

    # -- host side: a row enters / leaves a slot --------------------------------------------------

    def reset(self, slots: Tensor, keys: Tensor, min_len: Tensor) -> None:
        """Give ``slots`` (b,) to new rows: their noise keys and min lengths; history and counters cleared."""
        self.keys[slots] = keys
        self.lanes[:, :, slots] = key_lanes(keys.to(self.keys.device))
        self.keys_hi[slots] = (keys.to(self.keys.device).to(torch.int64) >> 32) & _M32
        self.min_len[slots] = min_len
        self.hist[slots] = -1
        self.counters[:, slots] = 0
        self.err[:, slots] = 0
        self.err[1, slots] = -1

    def state_rows(self) -> Tensor:
        """(slots, 9 + 4) int64: every counter then the error record, for one host read.

        Only the "error" policy stores an error kind per step; under the others a recorded error
        (step >= 0) is always "no candidate", filled in here, off the step.
        """
        err = self.err
        if self.options.nonfinite_policy != "error":
            err = torch.cat([torch.where(err[1:2] >= 0, _ERR_EMPTY, 0), err[1:]])
        return torch.cat([self.counters, err]).T

    # -- the filters ------------------------------------------------------------------------------

    def _mask(self, x: Tensor, live: Tensor, step: Tensor) -> tuple[Masked, Tensor]:
        """Min-length mask and non-finite policy; returns the masked logits and per-row flags (6, S):
        nan, all_nan, posinf (before the masks), no candidate, min_len_suppressed, a +inf row.

        Written for few operations per step: the six row reductions are one ``any`` over a stack,
        ``x > -inf`` is "candidate" (NaN compares false), and NaN goes to -inf in the same
        ``nan_to_num`` that the LEGACY policy uses to turn it into 0.0.
        """
        opt = self.options
        ninf = self.neg_inf
        isnan = torch.isnan(x)
        isposinf = torch.isposinf(x)
        blocked = (step < self.min_len)[:, None] & self.stop_cols
        x1 = torch.where(blocked, ninf, x)
        # LEGACY "legacy-zero": the pre-fix behaviour, NaN read as a 0.0 logit (an almost-uniform draw)
        xn = torch.nan_to_num(x1, nan=0.0 if opt.nonfinite_policy == "legacy-zero" else NEG_INF,
                              posinf=float("inf"), neginf=NEG_INF)
        cand = xn > ninf
        posinf = torch.isposinf(xn)
        rows = (
            torch.stack([isnan, ~isnan, isposinf, cand, blocked & (x > ninf), posinf]).any(2) ^ self.stat_flip
        )
        empty, row_posinf = rows[3], rows[5]
        abort = empty
        if opt.nonfinite_policy == "error":
            n_nan, n_pinf = (isnan & ~blocked).sum(1), posinf.sum(1)
            bad = (n_nan > 0) | row_posinf
            abort = abort | bad
            kind = torch.where(bad, _ERR_NONFINITE, self.err_kind)
            first = live & abort & (self.err[1] < 0)
            self.err.copy_(torch.where(first[None], torch.stack([kind, step, n_nan, n_pinf]), self.err))
        else:  # the kind is always "no candidate" and no counts are kept: only the step is stored
            first = live & abort & (self.err[1] < 0)
            self.err[1].copy_(torch.where(first, step, self.err[1]))

        # A +inf row draws uniformly among its +inf entries: logits 0 there, -inf elsewhere.
        x = torch.where(row_posinf[:, None], torch.where(posinf, self.zero, ninf), xn)
        return Masked(x, cand, row_posinf, abort), rows

    def _repeated(self, pick: Tensor) -> Tensor:
        """Did ``pick`` occur at least ``win_size * tau_r`` times in the slot's last win_size tokens?"""
        hits = self.hist == pick[:, None]
        if self.n_repeat == 1:
            return hits.any(1)
        return hits.sum(1) >= self.n_repeat  # an integer count >= a float t <=> count >= ceil(t)

    def _race(self, m: Masked, logp: Tensor, step: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Nucleus draw, then the repetition check's fallback draw over the whole distribution.

        The nucleus (spec section 4: stable descending sort, keep while the running sum before an
        entry is < top_p, at most top_k) as a threshold: ``torch.topk`` over an integer key that
        orders by probability and then by ascending index, a strict total order equal to the
        stable sort, so the kept entries are exactly those whose key is at least the key of the
        last kept one; the running sums are over the same top-k probabilities in the same order as
        :func:`nucleus_keep`. A +inf row keeps all its +inf entries (uniform; logp is -inf
        elsewhere). The race itself is the exponential race over the whole vocabulary, as before:
        argmax picks the lowest index among equal keys, like the reference.
        """
        opt = self.options
        g = race_log_exp(self.lanes, self.keys_hi, step, self.vocab_hash, self.draw_consts)  # (2, S, V)
        probs = logp.exp()
        rank = torch.add(self.rank_tail, probs.view(torch.int32).to(torch.int64), alpha=1 << self._rank_shift)
        top = torch.topk(rank, min(opt.top_k, rank.shape[1]), dim=1)
        running = probs.gather(1, top.indices).cumsum(1)
        kept = (running[:, :-1] < opt.top_p).sum(1, keepdim=True)  # entries kept after the first
        keep = (rank >= top.values.gather(1, kept)) | m.row_posinf[:, None]
        pick = torch.where(keep, logp - g[0], self.neg_inf).argmax(1)

        repeated = self._repeated(pick)
        x_fb = m.x.scatter(1, pick[:, None], NEG_INF)  # exclude the repeated id (on a copy)
        # A row with nothing else left is all -inf: its log_softmax is NaN and its max is not > -inf.
        fb = (torch.log_softmax(x_fb, dim=-1) - g[1]).max(1)
        has_other = fb.values > self.neg_inf
        fell = repeated & has_other
        restored = repeated ^ fell  # sole-token restore: return the original pick
        return torch.where(fell, fb.indices, pick), fell, restored

    # -- the step -----------------------------------------------------------------------------------

    def forward(self, logits: Tensor, live: Tensor, step: Tensor) -> tuple[Tensor, Tensor]:
        """One draw per slot: ``logits`` (S, V) raw, ``live`` (S,) bool, ``step`` (S,) int64 ->
        (tokens (S,) int64, aborted (S,) bool). Non-live slots change no state; an aborted slot
        gets ``speech_token_size``. Tokens ``>= speech_token_size`` mean "stop"."""
        opt = self.options
        x = logits.to(torch.float32)
        m, rows = self._mask(x, live, step)
        logp = torch.log_softmax(m.x, dim=-1)
        if opt.draw == "legacy-multinomial":
            probs = logp.exp()
            keep = (
                torch.where(m.row_posinf[:, None], m.cand, nucleus_keep(probs, opt.top_p, opt.top_k)) & m.cand
            )
            tokens, fell, restored = self._legacy_draw(m.x, probs, keep, live, m.abort)
        else:
            tokens, fell, restored = self._race(m, logp, step)
        ok = live & ~m.abort
        tokens = torch.where(m.abort, self.stop_token, tokens)
        self._record(tokens, ok)
        # order: COUNTER_NAMES; rows = nan, all_nan, posinf, no candidate, min_len_suppressed, +inf row
        inc = torch.cat(
            [
                live[None],
                (tokens < self.speech_token_size)[None],
                rows[:4],
                fell[None],
                restored[None],
                rows[4:5],
            ]
        )
        self.counters.add_(inc & torch.where(self.ok_gated, ok, live))
        return tokens, m.abort

    def _record(self, tokens: Tensor, ok: Tensor) -> None:
        """Append the returned tokens of ``ok`` slots to their windows (oldest first; the
        repetition check only counts, so a shift replaces a ring buffer and its cursor)."""
        self.hist.copy_(
            torch.where(ok[:, None], torch.cat([self.hist[:, 1:], tokens[:, None]], 1), self.hist)
        )

    def _legacy_draw(self, x: Tensor, probs: Tensor, keep: Tensor, live: Tensor,
                     abort: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """LEGACY: official-style per-row ``multinomial`` draws (loops and syncs; comparisons only).

        One multinomial over the kept probabilities in sorted order, and one over the full softmax
        (repeated id at -inf) when the repetition check fires, from the slot's own generator.
        """
        b = x.shape[0]
        dev = x.device
        tokens = torch.zeros(b, dtype=torch.int64, device=dev)
        fell = torch.zeros(b, dtype=torch.bool, device=dev)
        restored = torch.zeros(b, dtype=torch.bool, device=dev)
        for i, (on, ab) in enumerate(zip(live.tolist(), abort.tolist(), strict=True)):
            g = self.generators[i]
            if not on or ab or g is None:
                continue
            p_sorted, idx_sorted = torch.sort(probs[i], descending=True, stable=True)
            k = max(1, int(keep[i].sum()))
            kept_p = p_sorted[:k]
            if float(kept_p.sum()) <= 0.0:
                kept_p = torch.ones_like(kept_p)
            t = int(idx_sorted[:k][torch.multinomial(kept_p, 1, replacement=True, generator=g)])
            tok = t
            if int((self.hist[i] == t).sum()) >= self.options.repetition_threshold:
                row = x[i].clone()
                row[t] = NEG_INF
                if bool((row != NEG_INF).any()):
                    tok = int(torch.multinomial(row.softmax(0), 1, replacement=True, generator=g))
                    fell[i] = True
                else:
                    restored[i] = True
            tokens[i] = tok
        return tokens, fell, restored


def legacy_generator(seed: int, segment: int, key: int, device: torch.device | str) -> torch.Generator:
    """The LEGACY multinomial generator of one row segment: seeded with the row seed for segment 0
    (like a seeded official run), with the segment's stream key otherwise."""
    g = torch.Generator(device=device)
    g.manual_seed((seed if segment == 0 else key) & ((1 << 64) - 1))
    return g

