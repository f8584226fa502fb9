"""The talker's door: decode a list of requests (:func:`generate`), or keep a session open.

:func:`generate` is a :class:`~cosyclone.talker.session.TalkerSession` handed every request at
once. The names callers use are importable from here: the requests and options
(:mod:`~cosyclone.talker.request`), the results and the silent filter
(:mod:`~cosyclone.talker.results`), the session (:mod:`~cosyclone.talker.session`). ``generate``
builds its session by this module's ``TalkerSession`` name (the engine's scheduler does too), so
a test that replaces the session replaces it here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.request import (
    DecodeOptions,
    StepMechanics,
    TalkerRequest,
    length_limits,
    prompt_batch,
    prompt_length,
)
from cosyclone.talker.results import MAX_SILENT, SILENT_TOKENS, TalkerResult, silent_filter
from cosyclone.talker.session import TalkerSession

__all__ = ["MAX_SILENT", "SILENT_TOKENS", "DecodeOptions", "StepMechanics", "TalkerRequest", "TalkerResult", "TalkerSession",
           "generate", "length_limits", "prompt_batch", "prompt_length", "silent_filter"]


@torch.no_grad()
def generate(model: CosyVoice3LM, requests: Sequence[TalkerRequest],
             options: DecodeOptions | None = None) -> list[TalkerResult]:
    """Decode every request, ``options.slots`` at a time (default: all at once); results are in
    request order and do not depend on the slot count or the admission order."""
    options = options or DecodeOptions()
    if not requests:
        return []
    n = len(requests)
    max_len = [length_limits(model, options, r)[1] for r in requests]
    # one cache for the whole call, sized for its longest prompt and longest row (no growth on the way)
    capacity = options.mechanics.capacity or (max(prompt_length(r) for r in requests) + max(1, max(max_len)))
    session = TalkerSession(model, options, slots=min(n, options.slots or n), capacity=capacity,
                            token_capacity=max(1, max(max_len)))
    session.add(requests)
    session._fit(list(range(n)))  # only checks: a fixed ``options.mechanics.capacity`` below a row's need raises
    found: dict[int, TalkerResult] = {}
    try:
        found.update(session.drain())
    finally:
        session.close()
    return [found[t] for t in range(n)]
