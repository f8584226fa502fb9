"""The prefill's attention never builds every (T, T) score on an accelerator: query chunks bounded
by ``PREFILL_SCORES``, each row's arithmetic the one-call arithmetic (bit-equal on CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cosyclone.talker.qwen2 import PREFILL_SCORES, attention_mask, prefill_attention


def _inputs(b: int, h: int, hkv: int, t: int, dh: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, t, dh, generator=g).to(device) for n in (h, hkv, hkv))
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g)
    mask = attention_mask(torch.arange(t)[None].expand(b, t), t, lengths).to(device)  # causal + padding
    return q, k, v, mask


class Spy:
    """SDPA, recording the scores each call holds (rows x heads x queries x keys)."""

    def __init__(self) -> None:
        self.scores: list[int] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.scores.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("t", [300, 1100])
def test_chunks_stay_within_the_bound_and_give_the_one_call_bytes(t: int) -> None:
    q, k, v, mask = _inputs(3, 14, 2, t, 64)  # the released talker's heads and head size
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    bound = 3 * 14 * t * 64  # 64 query rows per call
    spy = Spy()
    chunked = prefill_attention(q, k, v, mask, gqa=True, max_scores=bound, attend=spy)
    assert len(spy.scores) == -(-t // 64) and max(spy.scores) <= bound < 3 * 14 * t * t
    assert torch.equal(chunked, whole)  # each query row sees every key and its own mask row


def test_no_bound_is_one_call_and_a_bound_the_call_fits_is_one_call_too() -> None:
    q, k, v, mask = _inputs(2, 4, 2, 37, 16)
    for bound in (None, 2 * 4 * 37 * 37):
        spy = Spy()
        prefill_attention(q, k, v, mask, gqa=True, max_scores=bound, attend=spy)
        assert spy.scores == [2 * 4 * 37 * 37]


def test_a_row_too_wide_for_the_bound_still_runs_one_query_at_a_time() -> None:
    q, k, v, mask = _inputs(2, 4, 2, 20, 16)
    spy = Spy()
    out = prefill_attention(q, k, v, mask, gqa=True, max_scores=10, attend=spy)
    assert spy.scores == [2 * 4 * 1 * 20] * 20 and out.shape == q.shape


def test_the_bound_keeps_a_full_admission_small() -> None:
    """An admission of 64 slots of 30 s prompts (~900 cells): one call would hold 64 x 14 x 900^2
    fp32 scores (2.9 GB); a chunk holds at most PREFILL_SCORES (256 MiB)."""
    b, h, t = 64, 14, 900
    rows = max(1, PREFILL_SCORES // (b * h * t))
    assert rows < t and b * h * rows * t * 4 <= 256 * 2**20 < b * h * t * t * 4


@pytest.mark.gpu
def test_chunked_prefill_on_cuda_agrees_with_one_call_and_holds_less_memory() -> None:
    """On CUDA the math kernel (GQA with a mask) holds b x H x T x T scores (1.3 GB here); the chunks
    hold at most their bound's scores, softmax and mask (and the output twice, for the concatenation),
    and agree with the one call within fp32 rounding (cuBLAS picks kernels by shape)."""
    q, k, v, mask = _inputs(16, 14, 2, 1200, 64, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    one_call = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    chunked = prefill_attention(q, k, v, mask, gqa=True, max_scores=PREFILL_SCORES)
    chunks = torch.cuda.max_memory_allocated() - base
    print(f"prefill attention peak: one call {one_call / 2**30:.2f} GiB, chunked {chunks / 2**30:.2f} GiB")
    assert chunks <= 2 * whole.numel() * 4 + 4 * PREFILL_SCORES * 4
    valid = mask[:, 0].any(-1)[:, None, :, None].expand_as(whole)  # padded query rows are never read
    assert torch.allclose(chunked[valid], whole[valid], atol=1e-5, rtol=1e-4)
