"""What the frontend hands to the talker and code2wav: one :class:`Request` per text segment.

Mode decides what the LLM sees (spec 1.2): only zero_shot feeds prompt speech tokens to the LLM;
cross_lingual and instruct2 give the flow the prompt but the LLM none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosyclone.errors import CosycloneError
from cosyclone.options import Mode

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
    mode: Mode = "zero_shot"
    segment_text: str = ""
    # normalized segment text (cross_lingual: with the system prefix); target_len counts its ids

    def __post_init__(self) -> None:
        tok, feat = self.embed["speech_token"], self.embed["speech_feat"]
        if feat.shape[0] != 2 * tok.shape[0]:
            raise CosycloneError(f"row {self.row_id!r}: prompt mel has {feat.shape[0]} frames but "
                                 f"{tok.shape[0]} prompt tokens (must be exactly 2x)")
        if not 0 < self.target_len <= self.text_ids.numel():
            raise CosycloneError(
                f"row {self.row_id!r}: target_len {self.target_len} outside 1..{self.text_ids.numel()}"
            )

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
