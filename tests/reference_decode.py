"""Today's decode loop, kept as the reference the slot engine must equal token for token.

All rows are prefilled together; every step the per-call :class:`BatchSampler` draws for the rows
still running (their logits handed over after ``logits_hook``, as the pre-engine ``generate``
did), the host applies the stop rules, and the model steps every slot. Only the bookkeeping is
the old one: the model step is the engine's, so a difference can only come from the sampler, the
stop rules or the scheduling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch

from cosyclone.talker import DecodeOptions, TalkerRequest, TalkerResult, prompt_batch, silent_filter
from cosyclone.talker.diagnostics import StopReason
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.sampler import SamplerOptions
from tests.samplers import BatchSampler


@torch.no_grad()
def reference_generate(model: CosyVoice3LM, requests: Sequence[TalkerRequest],
                       options: DecodeOptions,
                       logits_hook: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None,
                       ) -> list[TalkerResult]:
    """Every request decoded by the per-call sampler; ``logits_hook(logits, rows, step)`` sees the
    logits of the rows still running (``rows``: indices into ``requests``) before each draw."""
    cfg = model.cfg
    S = cfg.speech_token_size
    n = len(requests)
    min_len = [options.min_len_override if options.min_len_override is not None
               else int(cfg.min_len_ratio * r.target_len) for r in requests]
    max_len = [options.max_len_override if options.max_len_override is not None
               else int(cfg.max_len_ratio * r.target_len) for r in requests]
    opts = options.sampler or SamplerOptions.from_config(cfg.sampling)
    sampler = BatchSampler(opts, row_ids=[r.row_id for r in requests], row_seeds=[r.seed for r in requests],
                           segments=[r.segment for r in requests], min_len=min_len,
                           speech_token_size=S, device=model.device)
    embeds, lengths = prompt_batch(model, requests)
    model.setup_cache(n, int(lengths.max()) + max(1, max(max_len)))
    raw: list[list[int]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    try:
        logits = model.prefill(embeds, lengths)
        pos = lengths.clone()
        alive = [i for i in range(n) if max_len[i] > 0]
        for i in range(n):
            if max_len[i] <= 0:
                reasons[i] = "max_len"
        step = 0
        while alive:
            rows = torch.tensor(alive, dtype=torch.int64)
            x = logits.index_select(0, rows)
            if logits_hook is not None:
                x = logits_hook(x, rows, step)
            tokens, aborted = sampler.sample(x, rows, step)
            still = []
            for r, tok, ab in zip(alive, tokens.tolist(), aborted.tolist(), strict=True):
                if ab:
                    reasons[r] = "aborted"
                elif tok >= S:
                    reasons[r] = "eos"
                else:
                    raw[r].append(tok)
                    if len(raw[r]) >= max_len[r]:
                        reasons[r] = "max_len"
                    else:
                        still.append(r)
            alive = still
            feed = torch.zeros(n, dtype=torch.int64)
            feed[rows] = tokens.clamp(0, cfg.decoder_size - 1)
            logits = model.step(model.embed_speech(feed)[:, None], pos.clamp(max=model.cache.capacity - 1))
            pos[torch.tensor(still, dtype=torch.int64)] += 1
            step += 1
    finally:
        model.clear_cache()
    kept = [silent_filter(t) for t in raw]
    diags = sampler.finish([None if x == "aborted" else x for x in reasons], [len(k) for k in kept])
    out = []
    for r, req in enumerate(requests):
        reason = reasons[r] or "max_len"
        if reason == "aborted":
            reason = diags[r].stop_reason or "error"
        out.append(TalkerResult(row_id=req.row_id, tokens=kept[r], raw_tokens=raw[r],
                                stop_reason=cast(StopReason, reason),
                                diagnostics=diags[r], min_len=min_len[r], max_len=max_len[r]))
    return out
