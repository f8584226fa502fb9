"""What the frontend hands to the talker and code2wav: one :class:`Request` per text segment.

``batch_requests`` pads a list of requests into one nested dict of tensors with lengths (the
shape the batched stages and :mod:`cosyclone.handoff` want); ``unbatch`` is its exact inverse.
Mode decides what the LLM sees (spec 1.2): only zero_shot feeds prompt speech tokens to the LLM;
cross_lingual and instruct2 give the flow the prompt but the LLM none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cosyclone.errors import CosycloneError

LLM_PROMPT_MODES = ("zero_shot",)


@dataclass
class Request:
    """One segment of one row.

    text_ids: LongTensor (L,) = prompt text ids ++ target segment ids (what the LLM reads).
    target_len: number of target ids at the end of text_ids (min/max length count only these).
    embed: {"speech_token": (P,) long, "speech_feat": (2P, 80) float32, "embedding": (192,) float32}.
    segment_text: the normalized text of this segment (what the target ids spell), for the run record.
    """

    row_id: str
    segment: int
    text_ids: torch.Tensor
    target_len: int
    embed: dict[str, torch.Tensor]
    seed: int = 0
    speed: float = 1.0
    mode: str = "zero_shot"
    meta: dict[str, Any] = field(default_factory=dict)
    segment_text: str = ""  # normalized segment text (cross_lingual: with the system prefix); target_len counts its ids

    def __post_init__(self) -> None:
        tok, feat = self.embed["speech_token"], self.embed["speech_feat"]
        if feat.shape[0] != 2 * tok.shape[0]:
            raise CosycloneError(f"row {self.row_id!r}: prompt mel has {feat.shape[0]} frames but "
                                 f"{tok.shape[0]} prompt tokens (must be exactly 2x)")
        if not 0 < self.target_len <= self.text_ids.numel():
            raise CosycloneError(f"row {self.row_id!r}: target_len {self.target_len} outside 1..{self.text_ids.numel()}")

    @property
    def prompt_len(self) -> int:
        """Number of prompt-text ids at the start of ``text_ids`` (0 in cross_lingual)."""
        return int(self.text_ids.numel()) - self.target_len

    @property
    def llm_prompt_tokens(self) -> torch.Tensor:
        """Prompt speech tokens the LLM sees: the prompt's tokens in zero_shot, none otherwise (P',)."""
        tok = self.embed["speech_token"].to(torch.long)
        return tok if self.mode in LLM_PROMPT_MODES else tok[:0]


def llm_prompt_tokens(req: Request) -> torch.Tensor:
    """Functional form of :attr:`Request.llm_prompt_tokens`."""
    return req.llm_prompt_tokens


def to_talker_request(req: Request) -> Any:
    """The talker's ``TalkerRequest`` for this segment (imported lazily: talker is optional here)."""
    from cosyclone.talker.decode import TalkerRequest

    return TalkerRequest(row_id=req.row_id, text_ids=req.text_ids.to(torch.long), target_len=req.target_len,
                         prompt_speech_tokens=req.llm_prompt_tokens, seed=req.seed, segment=req.segment)


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
        "row_id": [r.row_id for r in reqs], "segment": [r.segment for r in reqs],
        "seed": [int(r.seed) for r in reqs], "speed": [float(r.speed) for r in reqs],
        "mode": [r.mode for r in reqs], "segment_text": [r.segment_text for r in reqs],
        "text_ids": text, "text_len": text_len,
        "target_len": torch.tensor([r.target_len for r in reqs], dtype=torch.long),
        "llm_prompt_token": llm_tok, "llm_prompt_token_len": llm_len,
        "embed": {"speech_token": tok, "speech_token_len": tok_len, "speech_feat": feat,
                  "speech_feat_len": feat_len,
                  "embedding": torch.stack([r.embed["embedding"].to(torch.float32).reshape(-1) for r in reqs])},
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
