"""Requests padded into one nested dict of tensors with lengths, and back (tests only).

``batch_requests`` gives the shape :mod:`cosyclone.base.handoff` carries (nested dicts of tensors);
``unbatch`` is its exact inverse. The product's stages pad what they need themselves, so this
round trip lives with the test that checks a frontend batch survives a handoff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cosyclone.errors import CosycloneError
from cosyclone.frontend.conditioning import Request


def _pad(seqs: Sequence[torch.Tensor], value: float = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad (L_i, ...) tensors → ((B, Lmax, ...), lengths (B,) long)."""
    lens = torch.tensor([s.shape[0] for s in seqs], dtype=torch.long)
    lmax = int(lens.max()) if len(seqs) else 0
    out = seqs[0].new_full((len(seqs), lmax, *seqs[0].shape[1:]), value)
    for i, s in enumerate(seqs):
        out[i, :s.shape[0]] = s
    return out, lens


def batch_requests(reqs: Sequence[Request]) -> dict[str, Any]:
    """Pad requests into one nested dict (all tensors batch-first, lengths alongside).

    {"row_id": [str], "segment": [int], "seed": [int], "speed": [float], "mode": [str], "segment_text": [str],
     "text_ids": (B, L) long, "text_len": (B,), "target_len": (B,),
     "llm_prompt_token": (B, P') long, "llm_prompt_token_len": (B,),
     "embed": {"speech_token": (B, P) long, "speech_token_len": (B,),
               "speech_feat": (B, 2P, 80), "speech_feat_len": (B,), "embedding": (B, 192)}}
    """
    if not reqs:
        raise CosycloneError("batch_requests needs at least one request")
    text, text_len = _pad([r.text_ids.to(torch.long) for r in reqs])
    tok, tok_len = _pad([r.embed["speech_token"].to(torch.long) for r in reqs])
    feat, feat_len = _pad([r.embed["speech_feat"].to(torch.float32) for r in reqs])
    llm_tok, llm_len = _pad([r.llm_prompt_tokens for r in reqs])
    return {
        "row_id": [r.row_id for r in reqs],
        "segment": [r.segment for r in reqs],
        "seed": [int(r.seed) for r in reqs],
        "speed": [float(r.speed) for r in reqs],
        "mode": [r.mode for r in reqs],
        "segment_text": [r.segment_text for r in reqs],
        "text_ids": text,
        "text_len": text_len,
        "target_len": torch.tensor([r.target_len for r in reqs], dtype=torch.long),
        "llm_prompt_token": llm_tok,
        "llm_prompt_token_len": llm_len,
        "embed": {
            "speech_token": tok,
            "speech_token_len": tok_len,
            "speech_feat": feat,
            "speech_feat_len": feat_len,
            "embedding": torch.stack([r.embed["embedding"].to(torch.float32).reshape(-1) for r in reqs]),
        },
    }


def unbatch(batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Inverse of :func:`batch_requests`: per-row dicts with padding removed (same keys as Request)."""
    emb = batch["embed"]
    rows = []
    for i, row_id in enumerate(batch["row_id"]):
        p = int(emb["speech_token_len"][i])
        rows.append({
            "row_id": row_id, "segment": int(batch["segment"][i]), "seed": int(batch["seed"][i]),
            "speed": float(batch["speed"][i]), "mode": batch["mode"][i],
            "segment_text": str(batch.get("segment_text", [""] * len(batch["row_id"]))[i]),
            "text_ids": batch["text_ids"][i, :int(batch["text_len"][i])].clone(),
            "target_len": int(batch["target_len"][i]),
            "embed": {"speech_token": emb["speech_token"][i, :p].clone(),
                      "speech_feat": emb["speech_feat"][i, :int(emb["speech_feat_len"][i])].clone(),
                      "embedding": emb["embedding"][i].clone()},
        })
    return rows


def requests_from_batch(batch: Mapping[str, Any]) -> list[Request]:
    """:func:`unbatch` then rebuild :class:`Request` objects."""
    return [Request(**row) for row in unbatch(batch)]
