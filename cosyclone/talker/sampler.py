"""Batched repetition-aware sampling (RAS) for the CosyVoice3 talker.

What the released model does per row (``cosyvoice/utils/common.py``, spec section 4):

1. **Nucleus**: ``p = softmax(scores)``; stable descending sort; keep entries while the running
   sum of kept probabilities is ``< top_p`` and fewer than ``top_k`` are kept (the entry that
   crosses ``top_p`` is kept too); draw one of them proportionally to ``p``.
2. **Repetition check**: count the pick among the row's last ``win_size`` returned tokens; if the
   count is ``>= win_size * tau_r`` (1.0 with the released values) exclude that id and draw from
   the softmax of the *entire* score vector (stop ids included).  If excluding it leaves nothing,
   the original pick is returned unchanged (a "sole-token restore"; the official code would have
   drawn from an all-NaN softmax here).

What this module adds, and why:

* **Batched, sync-free draws.**  Every draw is an exponential race: ``argmax_i p_i / q_i`` with
  ``q_i ~ Exp(1)`` i.i.d., which picks ``i`` with probability ``p_i / sum(p)`` — exactly what
  ``torch.multinomial`` does, but as pure tensor ops (no host sync, no per-row loop).  It is done
  in log space (``log p_i - log q_i``) so that probabilities that underflow in float32 keep a
  finite key and excluded entries (``-inf``) can never win.
* **Batch-independent randomness.**  The ``q`` noise is *counter based*: an integer hash of
  (stream key, step, draw index, vocabulary index) computed with int64 tensor ops on the device,
  turned into a uniform in (0, 1) and then into ``-log u``.  A stream key is 64 bits, derived
  from the row's seed and the segment index (:func:`stream_key`), so every text segment of a row
  draws its own randoms and a row's tokens do not depend on which rows share its batch, on the
  batch size or on its position (per-row ``torch.Generator`` objects would need a loop per step; a
  hash is one batched kernel and reproducible across devices).  Both 32-bit halves of the key
  stay separate lanes of the hash (see :func:`uniform_noise`): two distinct keys never get the
  same noise vector at a step, so distinct rows collide with probability ~2**-64 per pair (a
  32-bit key would give ~116 colliding pairs per million rows).  All multiplications keep
  operands below 2**32 x 2**31, so no int64 overflow happens anywhere.
* **min-length.**  ``min_len_rule="block-all-stop"`` (default) masks every stop id
  (``>= speech_token_size``) while ``step < min_len``: the release-time code re-drew until a
  non-stop id came up, which is the same distribution as masking all stop ids and renormalising,
  and it really forbids an early stop.  ``"official-head"`` reproduces HEAD's quirk of masking only
  index ``speech_token_size`` (the *sos* id in CosyVoice 3, pitfall 8.6), for parity runs.
* **Non-finite logits** (after masks) follow ``nonfinite_policy``: ``"exclude"`` (default) drops
  NaN / -inf from the candidates, lets a row holding +inf pick uniformly among its +inf entries
  (never turning them into -inf), and aborts a row with no candidate (``no_finite_logits``) while
  the other rows continue; ``"error"`` aborts a row at its first NaN / +inf (or empty candidate
  set) with a message; ``"legacy-zero"`` is the LEGACY pre-fix behaviour (NaN -> 0.0 logit).
  Nothing raises for bad logits.
* ``draw="legacy-multinomial"`` is a LEGACY per-row ``torch.multinomial`` path (one generator per
  row seeded with the row seed) that consumes random numbers exactly like the official code; it
  loops and syncs, and exists only for comparisons with seeded official runs (segment 0 seeds its
  generator with the row seed itself, later segments with their stream key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast, get_args, overload

import torch
from torch import Tensor

from cosyclone.model.config import SamplingConfig
from cosyclone.options import Draw as DrawMethod
from cosyclone.options import NonfinitePolicy
from cosyclone.talker.diagnostics import SamplerRowDiagnostics, StopReason

# The policies' vocabularies are the run options' (one definition, cosyclone.options); the min-len rule
# is the sampler's own (official-head reproduces HEAD's quirk for the parity tests).
MinLenRule = Literal["block-all-stop", "official-head"]
NONFINITE_POLICIES: tuple[str, ...] = get_args(NonfinitePolicy)
DRAW_METHODS: tuple[str, ...] = get_args(DrawMethod)
MIN_LEN_RULES: tuple[str, ...] = get_args(MinLenRule)

# stop_reason values set by the sampler itself
NO_FINITE: StopReason = "no_finite_logits"
ERROR: StopReason = "error"

_M32 = 0xFFFFFFFF
_ERR_NONE, _ERR_NONFINITE, _ERR_EMPTY = 0, 1, 2


@dataclass(frozen=True)
class SamplerOptions:
    """Sampler settings; defaults are the released yaml's ``ras_sampling`` plus the fixed policies."""

    top_p: float = 0.8  # nucleus mass: keep while the running sum of kept probs is < top_p
    top_k: int = 25  # nucleus size cap (top_k=1 -> arg-max)
    win_size: int = 10  # repetition window: the row's last win_size returned tokens
    tau_r: float = 0.1  # repetition threshold ratio: fall back when count >= win_size * tau_r
    # exclude: NaN/-inf never drawn, +inf picked uniformly, a row with nothing finite aborted
    # (no_finite_logits); error: abort a row at its first NaN/+inf; legacy-zero: LEGACY, NaN read as 0.0
    nonfinite_policy: NonfinitePolicy = "exclude"
    # race: exponential-race draw on per-row counter noise; legacy-multinomial: LEGACY torch.multinomial
    draw: DrawMethod = "race"
    # block-all-stop: every stop id forbidden before min_len (release-time); official-head: only id S (HEAD)
    min_len_rule: MinLenRule = "block-all-stop"

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.win_size < 1:
            raise ValueError(f"win_size must be >= 1, got {self.win_size}")
        if self.nonfinite_policy not in NONFINITE_POLICIES:
            raise ValueError(
                f"nonfinite_policy must be one of {NONFINITE_POLICIES}, got {self.nonfinite_policy!r}"
            )
        if self.draw not in DRAW_METHODS:
            raise ValueError(f"draw must be one of {DRAW_METHODS}, got {self.draw!r}")
        if self.min_len_rule not in MIN_LEN_RULES:
            raise ValueError(f"min_len_rule must be one of {MIN_LEN_RULES}, got {self.min_len_rule!r}")

    @classmethod
    def from_config(cls, cfg: SamplingConfig, **overrides: object) -> SamplerOptions:
        """Options from the model's ``llm.sampling`` block; keyword overrides win."""
        base = cls(top_p=cfg.top_p, top_k=cfg.top_k, win_size=cfg.win_size, tau_r=cfg.tau_r)
        return replace(base, **overrides) if overrides else base  # type: ignore[arg-type]

    @property
    def repetition_threshold(self) -> float:
        """``win_size * tau_r``; a count at or above it triggers the fallback."""
        return self.win_size * self.tau_r

    @property
    def legacy(self) -> bool:
        return self.nonfinite_policy == "legacy-zero" or self.draw == "legacy-multinomial"


def row_seed(run_seed: int, row_id: str) -> int:
    """Seed of one row without a manifest ``seed``: a stable 63-bit hash of (run seed, row id).

    Derived once per row, by the pipeline; the talker and sampler use the value they are given.
    Deriving it from the row id (not the batch position) is what makes a row's tokens independent
    of batching; blake2b keeps it stable across processes and Python versions (``hash()`` is not).
    """
    digest = hashlib.blake2b(f"{int(run_seed)}\x00{row_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------------------------------------
# Counter-based noise


@overload
def _mix32(h: Tensor) -> Tensor: ...


@overload
def _mix32(h: int) -> int: ...


def _mix32(h: Tensor | int) -> Tensor | int:
    """A 32-bit avalanche hash on values in [0, 2**32); works on Python ints and int64 tensors.

    A bijection of [0, 2**32) (xor-shifts and odd multipliers mod 2**32). Both multipliers are
    < 2**31, so products stay < 2**63 and int64 never overflows.
    """
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _M32
    h = h ^ (h >> 15)
    h = (h * 0x446CA68B) & _M32
    return h ^ (h >> 16)


def stream_key(seed: int, segment: int = 0) -> int:
    """The 64-bit noise key of one text segment of a row, as a signed int64 value.

    A blake2b hash of (seed, segment): any seed size (a manifest seed may exceed 64 bits) and the
    segment index give distinct streams; the signed form is what an int64 tensor holds.
    """
    digest = hashlib.blake2b(f"noise\x00{int(seed)}\x00{int(segment)}".encode(), digest_size=8).digest()
    key = int.from_bytes(digest, "little")
    return key - (1 << 64) if key >= (1 << 63) else key


def _vocab_hash(vocab: int, device: torch.device) -> Tensor:
    return _mix32((torch.arange(vocab, dtype=torch.int64, device=device) * 0x61C88647 + 0x1B873593) & _M32)


def _counter(step: Tensor | int, draw: int) -> tuple[Tensor | int, Tensor | int]:
    """The two 32-bit counter lanes of (step, draw); ``step`` a Python int or an int64 tensor (b,)."""
    ctr = _mix32((_mix32((step & _M32) ^ 0x68E31DA4) ^ (int(draw) * 0x3C6EF372 + 0x5BD1E995)) & _M32)
    return ctr, _mix32(ctr ^ 0x27D4EB2F)


def uniform_noise(keys: Tensor, step: Tensor | int, draw: int, vocab: int, *,
                  vocab_hash: Tensor | None = None) -> Tensor:
    """Uniforms in (0, 1), shape (b, vocab), a pure function of (key, step, draw, vocab index).

    ``keys`` is an int64 tensor (b,) of :func:`stream_key` values (all 64 bits are used);
    ``step`` one int for every row, or an int64 tensor (b,) of per-row steps (rows of a slot
    batch are at different steps; both forms give the same numbers for the same step). The
    key's low and high halves go through separate bijective mixes with the step/draw counter, so
    per row and step the pair ``(a, c)`` differs for any two distinct keys; each entry is then
    ``mix(mix(a ^ vocab_hash[v]) ^ c)``.  24 random bits per entry; the +0.5 keeps u away from 0
    and 1 so ``-log u`` and ``log(-log u)`` stay finite.  Pure tensor ops: no host sync.
    """
    if isinstance(step, Tensor):
        ctr, ctr_hi = _counter(step.to(torch.int64), draw)
    else:
        ctr, ctr_hi = (int(c) for c in _counter(int(step), draw))
    keys = keys.to(torch.int64)
    lo = keys & _M32
    hi = (keys >> 32) & _M32  # arithmetic shift of a negative key, then masked: the high 32 bits
    a = _mix32(lo ^ ctr)
    c = _mix32(hi ^ ctr_hi)
    vh = _vocab_hash(vocab, keys.device) if vocab_hash is None else vocab_hash
    h = _mix32(_mix32(a[:, None] ^ vh[None, :]) ^ c[:, None])
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


#: ``_counter``'s per-draw constants of draws 0 and 1 (both < 2**32, so its ``& _M32`` is a no-op).
_DRAW_CONSTS = tuple(d * 0x3C6EF372 + 0x5BD1E995 for d in (0, 1))
_CTR_HI = 0x27D4EB2F  # ``_counter``'s constant of the high lane


def key_lanes(keys: Tensor) -> Tensor:
    """(2, 1, b) int64 for :func:`race_log_exp`: the keys' low halves, then ``_CTR_HI`` in every column.

    A slot's key is fixed while its row runs, so this is computed when the row enters the slot,
    not at every step.
    """
    keys = keys.to(torch.int64)
    return torch.stack([keys & _M32, torch.full_like(keys, _CTR_HI)])[:, None, :]


def race_log_exp(
    lanes: Tensor, keys_hi: Tensor, step: Tensor, vocab_hash: Tensor, draw_consts: Tensor
) -> Tensor:
    """``log(-log u)`` of draws 0 and 1 at once, (2, b, V) float32: the exact values of
    ``torch.log(-torch.log(uniform_noise(keys, step, d, V)))`` for ``d`` = 0, 1, in about a quarter
    of the operations of two :func:`uniform_noise` calls (what a decode step launches matters).

    ``lanes`` is :func:`key_lanes` of the keys, ``keys_hi`` (b,) their high halves ``(key >> 32) &
    0xFFFFFFFF``, ``step`` (b,) int64 in ``[0, 2**32)`` (the ``& 0xFFFFFFFF`` of the step is then a
    no-op and is skipped), ``draw_consts`` (2, 1) int64 :data:`_DRAW_CONSTS`. The same integer
    operations as :func:`_counter` and :func:`uniform_noise`, arranged so that independent lanes
    share one kernel: both draws side by side, and the key's low lane mixed together with the
    counter's high lane (``mix(lo ^ ctr)`` and ``mix(ctr ^ 0x27D4EB2F)`` are one mix of a (2, 2, b)
    tensor). The uniform ``(n + 0.5) * 2**-24`` is formed as ``float(2n + 1) * 2**-25``: the same
    float32 rounding (scaling by 2 commutes with it), and ``2n + 1`` is ``(h >> 7) | 1``.
    """
    s = _mix32(step ^ 0x68E31DA4)
    ctr = _mix32(s[None, :] ^ draw_consts)  # (2 draws, b)
    m = _mix32(ctr[None] ^ lanes)  # (2, 2, b): [0] = a (mixed low key lane), [1] = the counter's high lane
    c = _mix32(keys_hi ^ m[1])  # (2, b)
    h = _mix32(_mix32(m[0][:, :, None] ^ vocab_hash) ^ c[:, :, None])  # (2, b, V)
    u = ((h >> 7) | 1).to(torch.float32) * (1.0 / (1 << 25))
    return torch.log(-torch.log(u))


def race_keys(logp: Tensor, u: Tensor) -> Tensor:
    """Exponential-race keys ``log p - log q`` with ``q = -log u ~ Exp(1)``; argmax draws from p."""
    return logp - torch.log(-torch.log(u))


def nucleus_keep(probs: Tensor, top_p: float, top_k: int) -> Tensor:
    """Boolean (b, V) mask of the nucleus candidates of each row of ``probs`` (spec section 4).

    Stable descending sort; entry j (in sorted order) is kept iff j < top_k and the sum of the
    entries before it is < top_p.  Done with ``torch.topk`` (no sort of the whole vocabulary):
    the top-k *values* in descending order are the same whatever order ties come in, so the
    running sums and the number m of kept entries are exactly the sort's. The kept entries are a
    prefix of the sorted order (the running sum of non-negative values never decreases): every
    entry above the m-th value, plus the lowest-indexed entries equal to it (what a stable sort
    puts first) until there are m.
    """
    k = min(int(top_k), probs.shape[-1])
    head = torch.topk(probs, k, dim=-1, sorted=True).values
    # running sum *before* each entry (an exclusive cumsum; entry 0 sees 0.0 and is always kept)
    before = torch.cat([torch.zeros_like(head[:, :1]), torch.cumsum(head, dim=-1)[:, :-1]], dim=-1)
    m = (before < top_p).sum(-1, keepdim=True)  # >= 1
    last = head.gather(1, m - 1)  # the m-th largest value
    above = probs > last
    tied = probs == last
    need = m - above.sum(-1, keepdim=True)
    return above | (tied & (torch.cumsum(tied.to(torch.int32), dim=-1) <= need))


#: The per-row counters every sampler keeps, in this order (see :mod:`.diagnostics`).
COUNTER_NAMES: tuple[str, ...] = (
    "steps",
    "tokens_emitted",
    "nan_steps",
    "all_nan_steps",
    "posinf_steps",
    "no_finite_steps",
    "ras_fallbacks",
    "ras_sole_restores",
    "min_len_suppressed",
)


def row_diagnostics(opt: SamplerOptions, row_id: str, seed: int, segment: int, counters: Sequence[int], *,
                    dead: bool, err: Sequence[int], stop_reason: StopReason | None,
                    tokens_emitted: int | None = None) -> SamplerRowDiagnostics:
    """One row's :class:`SamplerRowDiagnostics` from its host-read counters (:data:`COUNTER_NAMES`
    order) and error record ``(kind, step, n_nan, n_posinf)``.

    ``stop_reason`` is "no_finite_logits"/"error" for a row the sampler aborted (``dead``),
    otherwise the caller's; ``tokens_emitted`` overrides the sampler's count (after the silent filter).
    """
    vals = {name: int(counters[k]) for k, name in enumerate(COUNTER_NAMES)}
    d = SamplerRowDiagnostics(row_id=row_id, seed=seed, segment=segment, policy=opt.nonfinite_policy,
                              draw=opt.draw, **cast(dict[str, Any], vals))  # the int counters by name
    if dead:
        kind, step, n_nan, n_pinf = (int(v) for v in err)
        if opt.nonfinite_policy == "error":
            d.stop_reason = ERROR
            if kind == _ERR_NONFINITE:
                d.error = (f"row {row_id!r}: non-finite logits at step {step}: {n_nan} NaN, {n_pinf} +inf "
                           "(nonfinite_policy='error')")
            else:
                d.error = f"row {row_id!r}: no finite logits left after masks at step {step}"
        else:
            d.stop_reason = NO_FINITE
            d.error = f"row {row_id!r}: no finite logits left after masks at step {step}"
            if opt.nonfinite_policy == "legacy-zero":
                d.error += " (LEGACY nonfinite_policy='legacy-zero')"
    elif stop_reason is not None:
        d.stop_reason = stop_reason
    if tokens_emitted is not None:
        d.tokens_emitted = int(tokens_emitted)
    return d
