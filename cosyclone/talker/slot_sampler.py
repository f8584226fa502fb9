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
syncs; such a step cannot be captured and is only for comparisons with seeded official runs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .sampler import (
    _ERR_EMPTY,
    _ERR_NONFINITE,
    COUNTER_NAMES,
    SamplerOptions,
    _vocab_hash,
    nucleus_keep,
    race_keys,
    uniform_noise,
)

NEG_INF = float("-inf")


class Masked(NamedTuple):
    """Logits after the masks and the non-finite policy, and what the filters saw on the way."""

    x: Tensor  # (S, V) fp32: -inf = not a candidate; garbage rows are all 0.0 (finite math)
    cand: Tensor  # (S, V) bool candidates
    row_posinf: Tensor  # (S,) a +inf row: uniform over its +inf entries
    abort: Tensor  # (S,) no candidate (or, under "error", a NaN/+inf seen)


class SlotSampler(nn.Module):
    """Per-slot RAS sampler state (registered buffers) and the in-step draw."""

    def __init__(self, options: SamplerOptions, *, slots: int, vocab: int, speech_token_size: int,
                 device: torch.device | str) -> None:
        super().__init__()
        self.options = options
        self.speech_token_size = int(speech_token_size)
        i64 = dict(dtype=torch.int64, device=device)
        buf = self.register_buffer
        buf("keys", torch.zeros(slots, **i64), persistent=False)  # stream_key(seed, segment) per slot
        buf("min_len", torch.zeros(slots, **i64), persistent=False)
        buf("hist", torch.full((slots, options.win_size), -1, **i64), persistent=False)  # ring buffer
        buf("hist_count", torch.zeros(slots, **i64), persistent=False)
        buf("counters", torch.zeros(len(COUNTER_NAMES), slots, **i64), persistent=False)
        buf("err", torch.zeros(4, slots, **i64), persistent=False)  # kind, step (-1 = none), n_nan, n_posinf
        buf("vocab_hash", _vocab_hash(vocab, torch.device(device)), persistent=False)
        cols = torch.arange(vocab, device=device)
        S = self.speech_token_size
        # official-head: HEAD masks index speech_token_size (= sos in CosyVoice 3) only
        buf("stop_cols", cols >= S if options.min_len_rule == "block-all-stop" else cols == S, persistent=False)
        self.generators: list[torch.Generator | None] = [None] * slots  # LEGACY multinomial only

    # -- host side: a row enters / leaves a slot --------------------------------------------------

    def reset(self, slots: Tensor, keys: Tensor, min_len: Tensor) -> None:
        """Give ``slots`` (b,) to new rows: their noise keys and min lengths; history and counters cleared."""
        self.keys[slots] = keys
        self.min_len[slots] = min_len
        self.hist[slots] = -1
        self.hist_count[slots] = 0
        self.counters[:, slots] = 0
        self.err[:, slots] = 0
        self.err[1, slots] = -1

    def state_rows(self) -> Tensor:
        """(slots, 9 + 4) int64: every counter then the error record, for one host read."""
        return torch.cat([self.counters, self.err]).T

    # -- the filters ------------------------------------------------------------------------------

    def _mask(self, x: Tensor, live: Tensor, step: Tensor) -> tuple[Masked, Tensor]:
        """Min-length mask and non-finite policy; returns the masked logits and the counter
        increments they produce, (5, S): nan, all_nan, posinf, min_len_suppressed, no_finite."""
        opt = self.options
        isnan = torch.isnan(x)
        isposinf = torch.isposinf(x)
        stats = [isnan.any(1), isnan.all(1), isposinf.any(1)]

        masked = (step < self.min_len)[:, None] & self.stop_cols[None, :]
        legal_before = ~isnan & (x != NEG_INF)
        stats.append((masked & legal_before).any(1))
        x = x.masked_fill(masked, NEG_INF)

        if opt.nonfinite_policy == "legacy-zero":
            # LEGACY: the pre-fix behaviour, NaN read as a 0.0 logit (an almost-uniform draw)
            x = torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=NEG_INF)
        isnan = torch.isnan(x)
        posinf = torch.isposinf(x)
        cand = ~isnan & (x != NEG_INF)
        row_posinf = posinf.any(1)
        empty = ~cand.any(1)
        stats.append(empty)
        abort = empty
        kind = torch.full_like(self.err[0], _ERR_EMPTY)
        n_nan, n_pinf = self.err[2], self.err[3]  # only "error" records the counts
        if opt.nonfinite_policy == "error":
            n_nan, n_pinf = isnan.sum(1), posinf.sum(1)
            bad = (n_nan > 0) | row_posinf
            abort = abort | bad
            kind = torch.where(bad, torch.full_like(kind, _ERR_NONFINITE), kind)
        first = live & abort & (self.err[1] < 0)
        self.err.copy_(torch.where(first[None], torch.stack([kind, step, n_nan, n_pinf]), self.err))

        # A +inf row draws uniformly among its +inf entries: logits 0 there, -inf elsewhere.
        x = torch.where(row_posinf[:, None], torch.where(posinf, 0.0, NEG_INF), x)
        x = torch.where(cand | row_posinf[:, None], x, NEG_INF)
        x = torch.where(abort[:, None] | empty[:, None], torch.zeros_like(x), x)  # garbage rows: keep math finite
        return Masked(x, x != NEG_INF, row_posinf, abort), torch.stack(stats)

    def _repeated(self, pick: Tensor) -> Tensor:
        """Did ``pick`` occur at least ``win_size * tau_r`` times in the slot's last win_size tokens?"""
        count = (self.hist == pick[:, None]).sum(1)
        return count.to(torch.float64) >= self.options.repetition_threshold

    def _race(self, m: Masked, logp: Tensor, keep: Tensor, step: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Nucleus draw, then the repetition check's fallback draw over the whole distribution."""
        vocab = m.x.shape[1]
        noise0 = uniform_noise(self.keys, step, 0, vocab, vocab_hash=self.vocab_hash)
        pick = torch.where(keep, race_keys(logp, noise0), NEG_INF).argmax(1)
        repeated = self._repeated(pick)
        x_fb = m.x.scatter(1, pick[:, None], NEG_INF)  # exclude the repeated id (on a copy)
        has_other = (x_fb != NEG_INF).any(1)
        logp_fb = torch.log_softmax(torch.where(has_other[:, None], x_fb, torch.zeros_like(x_fb)), dim=-1)
        noise1 = uniform_noise(self.keys, step, 1, vocab, vocab_hash=self.vocab_hash)
        fb_pick = torch.where(x_fb != NEG_INF, race_keys(logp_fb, noise1), NEG_INF).argmax(1)
        fell = repeated & has_other
        restored = repeated & ~has_other  # sole-token restore: return the original pick
        return torch.where(fell, fb_pick, pick), fell, restored

    # -- the step -----------------------------------------------------------------------------------

    def forward(self, logits: Tensor, live: Tensor, step: Tensor) -> tuple[Tensor, Tensor]:
        """One draw per slot: ``logits`` (S, V) raw, ``live`` (S,) bool, ``step`` (S,) int64 ->
        (tokens (S,) int64, aborted (S,) bool). Non-live slots change no state; an aborted slot
        gets ``speech_token_size``. Tokens ``>= speech_token_size`` mean "stop"."""
        opt = self.options
        S = self.speech_token_size
        x = logits.to(torch.float32)
        m, stats = self._mask(x, live, step)
        logp = torch.log_softmax(m.x, dim=-1)
        probs = logp.exp()
        keep = torch.where(m.row_posinf[:, None], m.cand, nucleus_keep(probs, opt.top_p, opt.top_k)) & m.cand
        if opt.draw == "legacy-multinomial":
            tokens, fell, restored = self._legacy_draw(m.x, probs, keep, live, m.abort)
        else:
            tokens, fell, restored = self._race(m, logp, keep, step)
        ok = live & ~m.abort
        tokens = torch.where(m.abort, torch.full_like(tokens, S), tokens)
        self._record(tokens, ok)
        # order: COUNTER_NAMES
        inc = torch.stack([live, ok & (tokens < S), live & stats[0], live & stats[1], live & stats[2],
                           live & stats[4], ok & fell, ok & restored, live & stats[3]])
        self.counters.add_(inc.to(torch.int64))
        return tokens, m.abort

    def _record(self, tokens: Tensor, ok: Tensor) -> None:
        """Append the returned tokens of ``ok`` slots to their ring buffers."""
        pos = (self.hist_count % self.options.win_size)[:, None]
        self.hist.scatter_(1, pos, torch.where(ok, tokens, self.hist.gather(1, pos)[:, 0])[:, None])
        self.hist_count.add_(ok.to(torch.int64))

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

