"""The official DiT's streaming (block-causal) attention mask, built here for the tests alone.

The product never streams: :class:`cosyclone.code2wav.dit_attention.DiTContext` holds a key mask
only. The reference vectors still hold the official estimator's streaming output, and that mask
differs per query, so the tests keep it as a check of the attention (SDPA and the bf16 bmm path)
under a mask that is not a plain key mask: they swap it into a context the DiT built.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from cosyclone.code2wav.dit_attention import DiTContext


def chunk_mask(mask: Tensor, chunk: int) -> Tensor:
    """``mask (B, 1, T)`` float/bool -> ``(B, 1, T, T)`` bool: streaming block-causal & padding.

    Rows that would be all false are set all true (the official mask helper does so; SDPA would
    return NaN otherwise).
    """
    t = mask.shape[-1]
    pos = torch.arange(t, device=mask.device)
    limit = (pos // chunk + 1) * chunk
    causal = pos.unsqueeze(0) < limit.unsqueeze(1)  # (T, T): query i sees key j < limit_i
    full = causal.unsqueeze(0) & mask.bool()  # (B, T, T)
    empty = ~full.any(dim=-1, keepdim=True)
    return (full | empty).unsqueeze(1)


def streaming_context(ctx: DiTContext, mask: Tensor, chunk: int) -> DiTContext:
    """``ctx`` (``DiT.context(mask)``) with the streaming mask of ``chunk`` frames instead of the key
    mask, as the official ``streaming=True`` call builds it (padded query rows: the last query's keys)."""
    attn = chunk_mask(mask, chunk)
    padded = not bool(mask.bool().all())
    return replace(ctx, attn_mask=attn, query_drop=~attn[:, 0, -1].unsqueeze(-1) if padded else None,
                   attn_block=None if ctx.scores is None else ~attn)
