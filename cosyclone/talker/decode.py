"""Decode a list of requests at once: :func:`generate`, a :class:`~cosyclone.talker.session.TalkerSession`
handed every request, its cache sized once for the longest, closed when every row is out (the
static schedule's talker and the isolation retries; the continuous schedule keeps a session open).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.request import DecodeOptions, TalkerRequest, length_limits, prompt_length
from cosyclone.talker.results import TalkerResult
from cosyclone.talker.session import TalkerSession

__all__ = ["TalkerSession", "generate"]


@torch.no_grad()
def generate(model: CosyVoice3LM, requests: Sequence[TalkerRequest], options: DecodeOptions | None = None, *,
             session_type: Callable[..., TalkerSession] = TalkerSession) -> list[TalkerResult]:
    """Decode every request, ``options.slots`` at a time (default: all at once); results are in
    request order and do not depend on the slot count or the admission order. ``session_type``
    builds the session (a subclass that runs each step its own way: a host-side sampler)."""
    options = options or DecodeOptions()
    if not requests:
        return []
    n = len(requests)
    max_len = [length_limits(model, options, r)[1] for r in requests]
    # one cache for the whole call, sized for its longest prompt and longest row (no growth on the way)
    capacity = options.mechanics.capacity or (max(prompt_length(r) for r in requests) + max(1, max(max_len)))
    session = session_type(model, options, slots=min(n, options.slots or n), capacity=capacity,
                           token_capacity=max(1, max(max_len)))
    session.add(requests)
    # only checks: a fixed ``options.mechanics.capacity`` below a row's need raises
    seqs = list(session.seqs.values())
    session.runner.fit(max(s.cells() for s in seqs), max(s.max_len for s in seqs))
    found: dict[int, TalkerResult] = {}
    try:
        found.update(session.drain())
    finally:
        session.close()
    return [found[t] for t in range(n)]
