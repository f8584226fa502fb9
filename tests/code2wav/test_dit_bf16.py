"""The DiT's bf16 CPU attention (two batched GEMMs around an in-place softmax, scores in a buffer
shared by every layer and step) against SDPA, with and without masks; fp32 keeps SDPA."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from cosyclone.base.device import resolve
from cosyclone.code2wav import dit_attention
from cosyclone.code2wav.dit import DiT
from cosyclone.code2wav.dit_attention import attention_bmm
from cosyclone.code2wav.flow import build_flow
from cosyclone.model.config import DiTConfig, FlowConfig, ModelConfig
from tests.base.test_cpu_gemm import ops_called
from tests.streaming_mask import streaming_context

CFG = DiTConfig(dim=64, depth=2, heads=4, dim_head=16, ff_mult=2)


def _sdpa(qkv: torch.Tensor, heads: int, mask: torch.Tensor | None,
          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    b, t, _ = qkv.shape
    q, k, v = (y.view(b, t, heads, -1).transpose(1, 2) for y in qkv.to(dtype).chunk(3, dim=-1))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, -1).float()


@pytest.fixture(autouse=True)
def _no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 path under test is the one CPUs without AMX take; on an AMX CI machine too."""
    monkeypatch.setattr(dit_attention, "cpu_has_amx", lambda: False)


@pytest.mark.parametrize("group", [4, 3, 1])
@pytest.mark.parametrize("case", ["full", "padded", "streaming"])
@torch.inference_mode()
def test_bf16_attention_equals_sdpa_within_bf16_rounding(case: str, group: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """All heads in one pass, or (long rows: buffers capped) in groups of 3 (the last one short) or 1."""
    t = 20
    monkeypatch.setattr(dit_attention, "ATTENTION_BUFFER_BYTES", group * 6 * t * t)
    torch.manual_seed(0)
    dit = DiT(CFG).to(torch.bfloat16)
    mask = torch.ones(3, 1, t)
    if case != "full":
        mask[1, :, 13:] = 0
        mask[2, :, 5:] = 0
    ctx = dit.context(mask)
    if case == "streaming":  # a mask that differs per query (the official streaming one, 6-frame chunks)
        ctx = streaming_context(ctx, mask, 6)
    assert ctx.scores is not None and ctx.scores.shape == (group, t, t) and ctx.scores.dtype == torch.float32
    assert (ctx.attn_mask is None) == (case == "full")
    # logits of a trained model's size (std ~6): scores rounded to bf16 would be off by ~0.3 here
    qkv = (torch.randn(3, t, 3 * CFG.heads * CFG.dim_head) * 5).to(torch.bfloat16)
    got = attention_bmm(qkv, CFG.heads, ctx)
    want = _sdpa(qkv, CFG.heads, ctx.attn_mask)
    sdpa_bf16 = _sdpa(qkv, CFG.heads, ctx.attn_mask, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    err, err_sdpa = (got.float() - want).abs().max().item(), (sdpa_bf16 - want).abs().max().item()
    assert err < 2 * err_sdpa + 1e-2 and err < 0.1, (err, err_sdpa)  # as close as bf16 SDPA is
    again = attention_bmm(qkv, CFG.heads, ctx)  # the shared buffer holds nothing a later call reads
    assert torch.equal(again, got)


@pytest.mark.parametrize("amx", [False, True])
@torch.inference_mode()
def test_bf16_cpu_without_amx_takes_the_bmm_attention_and_the_rest_keep_sdpa(
        amx: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 on a CPU without AMX: attention_bmm; fp32 (byte for byte as before) and AMX CPUs: SDPA."""
    monkeypatch.setattr(dit_attention, "cpu_has_amx", lambda: amx)
    torch.manual_seed(1)
    x, mu, cond = (torch.randn(2, 80, 12) for _ in range(3))
    mask, t, spks = torch.ones(2, 1, 12), torch.tensor([0.3, 0.6]), torch.randn(2, 80)
    for dtype, sdpa in ((torch.float32, True), (torch.bfloat16, amx)):
        dit = DiT(CFG).to(dtype)
        assert (dit.context(mask).scores is None) == sdpa
        ops = ops_called(lambda d=dit: d(x, mask, mu, t, spks, cond))
        assert ("aten.scaled_dot_product_attention" in ops) == sdpa, dtype
        assert ("aten.bmm" in ops) != sdpa, dtype


def test_bf16_rows_in_a_padded_batch_stay_close_to_the_rows_alone() -> None:
    """The bf16 path's masks: a short row padded inside a batch gives (within bf16 rounding) what it
    gives alone, and nothing past its end."""
    cfg = ModelConfig(flow=FlowConfig(vocab_size=40, pre_lookahead_channels=16, dit=CFG))
    flow = build_flow(cfg, replace(resolve("cpu", "fp32"), dtype=torch.bfloat16), load_format="dummy")
    g = torch.Generator().manual_seed(2)
    tok, pt = torch.randint(0, 40, (2, 9), generator=g), torch.randint(0, 40, (2, 4), generator=g)
    feat, emb = torch.randn(2, 8, 80, generator=g), torch.randn(2, 192, generator=g)
    lens, plens = torch.tensor([9, 4]), torch.tensor([4, 2])
    mel, mel_len = flow.inference(tok, lens, pt, plens, feat, emb, n_timesteps=3)
    for r in range(2):
        alone, _ = flow.inference(
            tok[r : r + 1, : lens[r]],
            lens[r : r + 1],
            pt[r : r + 1, : plens[r]],
            plens[r : r + 1],
            feat[r : r + 1, : 2 * plens[r]],
            emb[r : r + 1],
            n_timesteps=3,
        )
        n = int(mel_len[r])
        torch.testing.assert_close(mel[r:r + 1, :, :n], alone, rtol=0.05, atol=0.05)
        assert mel[r, :, n:].abs().max().item() == 0.0 if n < mel.shape[2] else True
