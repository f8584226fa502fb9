"""Per-row sampler diagnostics.

The original bug report that motivated these counters read "81 sampler calls, 46 entirely NaN": fp16 logits
overflowed, ``torch.multinomial`` raised for the whole batch and nobody could tell which utterance went wrong
or how often. The sampler (:mod:`cosyclone.talker.slot_sampler`, and the per-call reference in
tests/samplers.py) therefore keeps one set of counters per *original* row (accumulated on the device, read
when the row finishes) and turns them into one :class:`SamplerRowDiagnostics` per row, the way whisper's
``DecodingResult`` reports per-utterance facts next to the tokens.

Counter definitions (all count *row-steps*, i.e. one ``sample()`` call for one row):

* ``steps``: row-steps the row took part in (including the step on which it was aborted).
* ``nan_steps``: the row's logits held at least one NaN (before any mask).
* ``all_nan_steps``: every logit of the row was NaN.
* ``posinf_steps``: at least one +inf logit (before masks).
* ``no_finite_steps``: after masks and the non-finite policy no candidate was left
  (everything NaN or -inf); under ``exclude`` this aborts the row with ``no_finite_logits``.
* ``ras_fallbacks``: the repetition check fired and a replacement was drawn from the full
  distribution with the repeated id excluded.
* ``ras_sole_restores``: the repetition check fired but the repeated id was the only legal
  candidate, so it was returned unchanged.
* ``min_len_suppressed``: the min-length rule was active and masked at least one stop id that
  was still a legal candidate (finite or +inf) — i.e. a step on which the rule removed mass
  from stopping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

#: Why a segment's decoding stopped: the stop token (``eos``), the length cap (``max_len``), or the
#: sampler's abort (``no_finite_logits``, ``error``). One vocabulary for the talker, the row's result,
#: its record and every export.
StopReason = Literal["eos", "max_len", "no_finite_logits", "error"]
STOP_REASONS: tuple[str, ...] = get_args(StopReason)

#: Options whose behaviour is the pre-fix / official code kept only for comparisons.
LEGACY_POLICIES = frozenset({"legacy-zero"})
LEGACY_DRAWS = frozenset({"legacy-multinomial"})


@dataclass
class SamplerRowDiagnostics:
    """What the sampler saw for one original row (one utterance segment)."""

    row_id: str  # the caller's row id
    seed: int  # the row's seed, as the row record reports it (manifest seed, else from --seed and the id)
    segment: int = 0  # text-segment index within the row; the noise stream is stream_key(seed, segment)
    steps: int = 0  # row-steps sampled (see module docstring)
    tokens_emitted: int = 0  # non-stop tokens returned; the talker may overwrite (after silent filter)
    stop_reason: StopReason | None = None  # "no_finite_logits" / "error" when aborted; else set by the caller
    nan_steps: int = 0  # steps with any NaN logit
    all_nan_steps: int = 0  # steps whose logits were entirely NaN
    posinf_steps: int = 0  # steps with any +inf logit
    no_finite_steps: int = 0  # steps with no candidate left after masks
    ras_fallbacks: int = 0  # repetition check fired, replacement drawn
    ras_sole_restores: int = 0  # repetition check fired, repeated id was the only candidate
    min_len_suppressed: int = 0  # steps on which min-len masking removed a legal stop id
    policy: str = "exclude"  # nonfinite_policy in force ("legacy-zero" is LEGACY)
    draw: str = "race"  # draw method in force ("legacy-multinomial" is LEGACY)
    error: str | None = None  # message for stop_reason "error" / "no_finite_logits"
    graph_steps: int = 0  # decode steps of this row's slot that ran as a replayed CUDA graph (0: eager);
    # what really ran, not what was asked (a failed capture decodes eagerly:
    # TalkerSession.graph_capture_error)

    @property
    def legacy(self) -> bool:
        """True when a LEGACY (pre-fix) policy or draw produced these tokens."""
        return self.policy in LEGACY_POLICIES or self.draw in LEGACY_DRAWS

    @property
    def aborted(self) -> bool:
        """True when the sampler itself ended the row (not a stop token or max length)."""
        return self.stop_reason in ("no_finite_logits", "error")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for manifests / logs); includes the ``legacy`` flag."""
        out = asdict(self)
        out["legacy"] = self.legacy
        return out


def row_stop_reason(reasons: Sequence[StopReason]) -> StopReason | None:
    """A row's stop reason from its segments': the first that did not stop on the stop token, else
    ``eos`` (None: no segment was decoded). A dataset builder filters on it: ``max_len`` marks a row
    whose speech was cut at the token cap."""
    for reason in reasons:
        if reason != "eos":
            return reason
    return "eos" if reasons else None
