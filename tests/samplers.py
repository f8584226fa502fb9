"""Samplers for tests and benchmarks, outside the product: greedy, forced, and the per-call
reference RAS sampler.

:class:`BatchSampler` is the RAS rule written as one ``sample()`` per step over the rows still
running (the shape the spec describes); the product's in-step sampler
(:mod:`cosyclone.talker.slot_sampler`) must draw exactly its tokens and counters, which
tests/talker/test_engine_equivalence.py and the parity suite check. :class:`GreedySampler` and
:class:`ForcedSampler` draw in a :class:`tests.host_session.HostSession` (parity captures, decode
tests, the talker bench).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from cosyclone.talker.diagnostics import SamplerRowDiagnostics, StopReason
from cosyclone.talker.results import TalkerResult
from cosyclone.talker.sampler import (
    _ERR_EMPTY,
    _ERR_NONFINITE,
    COUNTER_NAMES,
    SamplerOptions,
    _vocab_hash,
    race_keys,
    row_diagnostics,
    stream_key,
    uniform_noise,
)
from cosyclone.talker.slot_sampler import SlotSampler, legacy_generator

__all__ = ["BatchSampler", "ForcedSampler", "GreedySampler", "legacy_slot_sampler", "nucleus_keep_sorted"]


def _block_stops(logits: Tensor, rows: Tensor, step: int, min_len: Tensor, stop_from: int) -> Tensor:
    """Mask every stop id (>= stop_from) for rows still below their minimum length."""
    active = (step < min_len.to(logits.device)[rows.to(logits.device)])[:, None]
    cols = torch.arange(logits.shape[1], device=logits.device)[None, :] >= stop_from
    return logits.masked_fill(active & cols, float("-inf"))


@dataclass
class GreedySampler:
    """Arg-max sampler; stop ids are blocked while a row is below its ``min_len``."""

    min_len: Sequence[int]  # per original row
    speech_token_size: int  # first stop id

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        x = _block_stops(
            logits.float(), rows, step, torch.as_tensor(list(self.min_len)), self.speech_token_size
        )
        return x.argmax(-1), torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        return [None] * len(self.min_len)


@dataclass
class ForcedSampler:
    """Returns ``forced[row][step]``, then ``stop_token`` (the reference capture's sampler)."""

    forced: Sequence[Sequence[int]]  # per original row, the tokens to return in order
    stop_token: int  # returned after a row's forced tokens run out
    calls: list[tuple[list[int], int]] = field(default_factory=list)  # (rows, step) of every call

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        idx = rows.tolist()
        self.calls.append((idx, step))
        toks = [self.forced[r][step] if step < len(self.forced[r]) else self.stop_token for r in idx]
        return (torch.tensor(toks, dtype=torch.int64, device=logits.device),
                torch.zeros(len(idx), dtype=torch.bool, device=logits.device))

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        return [None] * len(self.forced)


def nucleus_keep_sorted(probs: Tensor, top_p: float, top_k: int) -> Tensor:
    """:func:`nucleus_keep` by a full stable sort: the reference the top-k form must equal."""
    k = min(int(top_k), probs.shape[-1])
    sorted_p, sorted_idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    head = sorted_p[:, :k]
    before = torch.zeros_like(head)
    if k > 1:
        before[:, 1:] = torch.cumsum(head, dim=-1)[:, :-1]
    keep_sorted = before < top_p
    keep = torch.zeros_like(probs, dtype=torch.bool)
    return keep.scatter_(1, sorted_idx[:, :k], keep_sorted)


def legacy_slot_sampler(options: SamplerOptions, seeds: Sequence[int], *, speech_token_size: int, vocab: int,
                        min_len: Sequence[int] | None = None) -> SlotSampler:
    """The product's in-step sampler with one slot per seed, set up as a session sets up a row's
    first segment under the LEGACY multinomial draw (noise key, min length, the seeded generator).
    Call it as the engine does: ``sampler(logits (n, V), live (n,) bool, step (n,) int64)``."""
    n = len(seeds)
    sampler = SlotSampler(options, slots=n, vocab=vocab, speech_token_size=speech_token_size, device="cpu")
    keys = [stream_key(s, 0) for s in seeds]
    sampler.reset(torch.arange(n), torch.tensor(keys, dtype=torch.int64),
                  torch.tensor(list(min_len) if min_len is not None else [0] * n, dtype=torch.int64))
    for i, (seed, key) in enumerate(zip(seeds, keys, strict=True)):
        sampler.generators[i] = legacy_generator(seed, 0, key, "cpu")
    return sampler


# ---------------------------------------------------------------------------------------------


class BatchSampler:
    """RAS sampler over a batch whose rows may finish at different steps.

    The sampler is created once per batch with one entry per *original* row; each ``sample()``
    call gets the logits of the rows still running and their indices into the original batch.
    It keeps each row's token history (for the repetition window) and counters on the device, so
    a decode step costs no host synchronisation. Race draw only: the LEGACY multinomial draw is the
    product's alone (:func:`legacy_slot_sampler`), tested against the official capture, never
    against a copy of itself.
    """

    def __init__(self, options: SamplerOptions, *, row_ids: Sequence[str], row_seeds: Sequence[int],
                 min_len: Sequence[int], speech_token_size: int, device: torch.device | str,
                 segments: Sequence[int] | None = None) -> None:
        """``row_seeds[i]`` is entry i's row seed, used as given (reported unchanged in its
        diagnostics); ``segments[i]`` its text-segment index (default 0). Entry i draws from the
        noise stream ``stream_key(row_seeds[i], segments[i])``.
        """
        if options.draw != "race":
            raise ValueError(
                "BatchSampler draws the race draw only: the LEGACY multinomial draw is tested on the "
                "product's SlotSampler (legacy_slot_sampler) against the official capture"
            )
        n = len(row_ids)
        segs = [0] * n if segments is None else [int(g) for g in segments]
        if len(row_seeds) != n or len(min_len) != n or len(segs) != n:
            raise ValueError(f"row_ids ({n}), row_seeds ({len(row_seeds)}), min_len ({len(min_len)}) and "
                             f"segments ({len(segs)}) must have the same length")
        self.options = options
        self.row_ids = [str(r) for r in row_ids]
        self.row_seeds = [int(s) for s in row_seeds]
        self.segments = segs
        self.speech_token_size = int(speech_token_size)
        self.device = torch.device(device)
        dev = self.device
        i64: dict[str, Any] = dict(dtype=torch.int64, device=dev)
        self._keys = torch.tensor(
            [stream_key(s, g) for s, g in zip(self.row_seeds, segs, strict=True)], **i64
        )
        self._min_len = torch.tensor([int(m) for m in min_len], **i64)
        self._hist = torch.full((n, options.win_size), -1, **i64)  # ring buffer of returned tokens
        self._hist_count = torch.zeros(n, **i64)
        self._dead = torch.zeros(n, dtype=torch.bool, device=dev)  # aborted rows
        self._stopped = torch.zeros(n, dtype=torch.bool, device=dev)  # a stop id was returned
        self._err_kind = torch.zeros(n, **i64)
        self._err_step = torch.full((n,), -1, **i64)
        self._err_nan = torch.zeros(n, **i64)
        self._err_posinf = torch.zeros(n, **i64)
        names = COUNTER_NAMES
        self._counter_names = names
        self._counters = torch.zeros(len(names), n, **i64)  # one stacked tensor: a single read at finish
        self._vocab_hash: Tensor | None = None

    # -- helpers ---------------------------------------------------------------------------------

    def _count(self, name: str, rows: Tensor, values: Tensor) -> None:
        idx = self._counter_names.index(name)
        self._counters[idx].index_add_(0, rows, values.to(torch.int64))

    def _noise(self, rows: Tensor, step: int, draw: int, vocab: int) -> Tensor:
        if self._vocab_hash is None or self._vocab_hash.numel() != vocab:
            self._vocab_hash = _vocab_hash(vocab, self.device)
        return uniform_noise(self._keys[rows], step, draw, vocab, vocab_hash=self._vocab_hash)

    # -- the step --------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """Draw one token per row.

        ``logits`` (b, V) float, RAW (the talker hands unnormalised logits, so the non-finite
        policy below sees a NaN entry as one entry; log-probs also work, softmax being
        shift-invariant), converted to fp32 here whatever the run dtype; ``rows``
        (b,) int64 indices into the original batch (unique within a call); ``step`` the decode
        step (0 = first generated token), used by the min-length rule and the noise counter.
        Returns ``(tokens int64 (b,), aborted bool (b,))``.  Tokens ``>= speech_token_size`` mean
        "stop"; an aborted row gets ``speech_token_size`` so a careless caller stops it too.
        """
        opt = self.options
        rows = rows.to(device=self.device, dtype=torch.int64)
        x = logits.detach().to(device=self.device, dtype=torch.float32).clone()
        b, vocab = x.shape
        S = self.speech_token_size
        neg_inf = float("-inf")
        was_dead = self._dead[rows]
        live = ~was_dead
        self._count("steps", rows, live)

        # --- raw statistics (before any mask) ---
        isnan = torch.isnan(x)
        isposinf = torch.isposinf(x)
        any_nan = isnan.any(1)
        self._count("nan_steps", rows, live & any_nan)
        self._count("all_nan_steps", rows, live & isnan.all(1))
        self._count("posinf_steps", rows, live & isposinf.any(1))

        # --- min-length mask ---
        active = (step < self._min_len[rows])[:, None]
        cols = torch.arange(vocab, device=self.device)[None, :]
        # official-head: HEAD masks index speech_token_size (= sos in CosyVoice 3) only
        stop_cols = cols >= S if opt.min_len_rule == "block-all-stop" else cols == S
        masked = active & stop_cols
        legal_before = ~isnan & (x != neg_inf)
        self._count("min_len_suppressed", rows, live & (masked & legal_before).any(1))
        x = x.masked_fill(masked, neg_inf)

        # --- non-finite policy ---
        if opt.nonfinite_policy == "legacy-zero":
            # LEGACY: the pre-fix behaviour, NaN read as a 0.0 logit (an almost-uniform draw)
            x = torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=neg_inf)
        isnan = torch.isnan(x)
        posinf = torch.isposinf(x)
        cand = ~isnan & (x != neg_inf)
        row_posinf = posinf.any(1)
        empty = ~cand.any(1)
        self._count("no_finite_steps", rows, live & empty)
        abort = empty.clone()
        if opt.nonfinite_policy == "error":
            n_nan = isnan.sum(1)
            n_pinf = posinf.sum(1)
            bad = (n_nan > 0) | row_posinf
            abort = abort | bad
            first = live & abort & (self._err_step[rows] < 0)
            kind = torch.where(
                bad, torch.full_like(n_nan, _ERR_NONFINITE), torch.full_like(n_nan, _ERR_EMPTY)
            )
            self._err_kind[rows] = torch.where(first, kind, self._err_kind[rows])
            self._err_step[rows] = torch.where(first, torch.full_like(n_nan, int(step)), self._err_step[rows])
            self._err_nan[rows] = torch.where(first, n_nan, self._err_nan[rows])
            self._err_posinf[rows] = torch.where(first, n_pinf, self._err_posinf[rows])
        else:
            first = live & abort & (self._err_step[rows] < 0)
            self._err_kind[rows] = torch.where(first, torch.full_like(rows, _ERR_EMPTY), self._err_kind[rows])
            self._err_step[rows] = torch.where(first, torch.full_like(rows, int(step)), self._err_step[rows])
        abort = abort | was_dead

        # A +inf row draws uniformly among its +inf entries: logits 0 there, -inf elsewhere.
        x = torch.where(row_posinf[:, None], torch.where(posinf, 0.0, neg_inf), x)
        x = torch.where(cand | row_posinf[:, None], x, neg_inf)
        # garbage rows: keep math finite
        x = torch.where(abort[:, None] | empty[:, None], torch.zeros_like(x), x)
        cand = x != neg_inf

        logp = torch.log_softmax(x, dim=-1)
        probs = logp.exp()
        keep = nucleus_keep_sorted(probs, opt.top_p, opt.top_k)
        keep = torch.where(row_posinf[:, None], cand, keep) & cand

        key0 = torch.where(keep, race_keys(logp, self._noise(rows, step, 0, vocab)), neg_inf)
        pick = key0.argmax(1)
        repeated = self._repeated(rows, pick)
        # exclude the repeated id: work on a copy, the original row stays intact
        x_fb = x.scatter(1, pick[:, None], neg_inf)
        has_other = (x_fb != neg_inf).any(1)
        logp_fb = torch.log_softmax(torch.where(has_other[:, None], x_fb, torch.zeros_like(x_fb)), dim=-1)
        key1 = torch.where(x_fb != neg_inf, race_keys(logp_fb, self._noise(rows, step, 1, vocab)), neg_inf)
        fb_pick = key1.argmax(1)
        fell = repeated & has_other
        restored = repeated & ~has_other  # sole-token restore: return the original pick
        tokens = torch.where(fell, fb_pick, pick)

        ok = ~abort
        self._count("ras_fallbacks", rows, ok & fell)
        self._count("ras_sole_restores", rows, ok & restored)
        tokens = torch.where(abort, torch.full_like(tokens, S), tokens)
        self._record(rows, tokens, ok)
        self._count("tokens_emitted", rows, ok & (tokens < S))
        self._stopped[rows] = self._stopped[rows] | (ok & (tokens >= S))
        self._dead[rows] = self._dead[rows] | abort
        return tokens, abort

    def _repeated(self, rows: Tensor, pick: Tensor) -> Tensor:
        """Did ``pick`` occur at least ``win_size * tau_r`` times in the row's last win_size tokens?"""
        count = (self._hist[rows] == pick[:, None]).sum(1)
        return count.to(torch.float64) >= self.options.repetition_threshold

    def _record(self, rows: Tensor, tokens: Tensor, ok: Tensor) -> None:
        """Append returned tokens of non-aborted rows to the ring buffer (no boolean indexing: no sync)."""
        pos = self._hist_count[rows] % self.options.win_size
        old = self._hist[rows, pos]
        self._hist[rows, pos] = torch.where(ok, tokens, old)
        self._hist_count[rows] = self._hist_count[rows] + ok.to(torch.int64)

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[SamplerRowDiagnostics]:
        """One :class:`SamplerRowDiagnostics` per original row; counters are read here, once.

        ``stop_reason`` is "no_finite_logits"/"error" for rows the sampler aborted; otherwise the
        caller's ``stop_reasons[i]`` when given, else "stop_token" if the sampler returned a stop id,
        else None (the caller knows about max length).  ``tokens_emitted`` overrides the sampler's
        count of non-stop tokens (e.g. after the silent filter).
        """
        counters = self._counters.cpu().tolist()
        dead = self._dead.cpu().tolist()
        stopped = self._stopped.cpu().tolist()
        err = torch.stack([self._err_kind, self._err_step, self._err_nan, self._err_posinf]).cpu().tolist()
        out: list[SamplerRowDiagnostics] = []
        for i, rid in enumerate(self.row_ids):
            reason = stop_reasons[i] if stop_reasons is not None else None
            if reason is None and stopped[i]:
                reason = "stop_token"
            out.append(row_diagnostics(self.options, rid, self.row_seeds[i], self.segments[i],
                                       [int(c[i]) for c in counters], dead=bool(dead[i]),
                                       err=[int(e[i]) for e in err],
                                       # the reference's stop_token
                                       stop_reason=cast("StopReason | None", reason),
                                       tokens_emitted=None if tokens_emitted is None else tokens_emitted[i]))
        return out


def diag(r: TalkerResult) -> SamplerRowDiagnostics:
    """The sampler's counters of a result (the product's samplers always record them)."""
    assert r.diagnostics is not None, f"{r.row_id}: no sampler counters"
    return r.diagnostics
