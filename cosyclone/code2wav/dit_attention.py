"""The DiT's self-attention: rotary tables, the per-inference context, and two kernels (SDPA, bmm).

Why a module of its own: attention is the one part of the DiT whose *how* depends on the machine
(SDPA, or on a CPU without AMX in bf16 two batched GEMMs around an in-place softmax in buffers
shared by every layer and step), and it carries per-inference state (key masks, rotary table,
those buffers: :class:`DiTContext`) that the rest of the estimator never looks into. :mod:`.dit`
holds the layers whose arithmetic is fixed (embeddings, AdaLN, MLP, blocks) and asks this module
for a context once per solve.

Parity details (spec pitfall 2): rotary is applied to the *full-width* q/k before the head split
and only to its first ``dim_head`` channels, in interleaved-pair form, so only head 0 is
position-encoded. The three q/k/v projections are one matrix ``to_qkv``
(:mod:`cosyclone.model.fused`) under the released ``to_q``/``to_k``/``to_v`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyclone.model.fused import FusedLinears


class RotaryEmbedding(nn.Module):
    """x-transformers ``RotaryEmbedding(dim_head)``: base 10000, interleaved duplication.

    ``inv_freq`` is the checkpoint's one persistent buffer; :meth:`reset_buffers` recomputes it
    (needed after ``to_empty`` since dummy init only touches parameters).
    """

    inv_freq: Tensor

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.base = base
        self.register_buffer("inv_freq", self._inv_freq(None), persistent=True)

    def _inv_freq(self, device: torch.device | None) -> Tensor:
        return 1.0 / (self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
                                    / self.dim))

    def reset_buffers(self) -> None:
        self.inv_freq = self._inv_freq(self.inv_freq.device)

    def freqs(self, seq_len: int) -> Tensor:
        """``(T, dim)`` float32 angles: ``freqs[p, 2j] = freqs[p, 2j+1] = p * inv_freq[j]``."""
        pos = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        f = pos.unsqueeze(1) * self.inv_freq.float().unsqueeze(0)
        return f.repeat_interleave(2, dim=-1)

    def rotations(self, seq_len: int) -> Tensor:
        """``(T, 1, dim/2)`` complex64 unit rotations ``cos + i sin`` of :meth:`freqs` (one per pair)."""
        f = self.freqs(seq_len)[:, 0::2]
        return torch.complex(f.cos(), f.sin()).unsqueeze(1)


def rotate_(head: Tensor, rotations: Tensor) -> None:
    """Rotate ``head (B, T, N, rot)`` in place, pairs ``(2j, 2j+1)``, by :meth:`RotaryEmbedding.rotations`.

    A pair ``(x0, x1)`` rotated by ``(cos, sin)`` is ``(x0 cos - x1 sin, x1 cos + x0 sin)``, the
    x-transformers ``x * cos + rotate_half(x) * sin``: as complex numbers one multiply, which in
    float32 runs in place on the projection itself (no copies). ``N`` stacks q and k (the first
    ``rot`` channels of each full-width projection: only head 0 is position-encoded, spec pitfall
    2). Other dtypes are rotated in float32 and cast back, as x-transformers does with autocast off.
    """
    if head.dtype == torch.float32:
        torch.view_as_complex(head.view(*head.shape[:-1], -1, 2)).mul_(rotations)
        return
    wide = head.to(torch.float32, memory_format=torch.contiguous_format)
    pairs = wide.view(*wide.shape[:-1], -1, 2)
    head.copy_(torch.view_as_real(torch.view_as_complex(pairs) * rotations).flatten(-2))


#: The most :func:`attention_bmm`'s two buffers take together: all heads at once up to T ~ 590
#: frames (11.8 MB at the baseline request's 350), then fewer heads per pass, so a long row's
#: (T, T) scores never cost hundreds of MB where SDPA's kernel needs none.
ATTENTION_BUFFER_BYTES = 32 << 20


@cache
def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (torch's own check; False where this torch cannot tell)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


def bmm_attention_wanted(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the DiT's attention runs as :func:`attention_bmm`: bf16 inference on a CPU without
    AMX. On an AMX CPU SDPA's flash kernel multiplies bf16 on the tiles into float32 (that is how
    the flow reached about 1 TFLOP/s on two AMX cores), while this path's float32 QK^T would fall
    to the AVX-512 float32 rate: such CPUs keep SDPA, as measured there."""
    return (
        dtype == torch.bfloat16 and device.type == "cpu" and not torch.is_grad_enabled() and not cpu_has_amx()
    )


@dataclass(frozen=True)
class DiTContext:
    """Per-inference constants of the DiT's attention (the same at every Euler step): built once by
    :meth:`for_mask` instead of at each velocity evaluation.

    ``rotations``: rotary table (:meth:`RotaryEmbedding.rotations`); ``attn_mask`` bool, True =
    attend, broadcast as SDPA does: the DiT's own is the key mask ``(B, 1, 1, T)``; ``query_drop
    (B, T, 1)`` bool marks padded query rows whose output is zeroed; both None without padding.
    ``scores (G, T, T)`` float32 and ``probs (G, T, T)`` in the model dtype, G heads at a time
    (:data:`ATTENTION_BUFFER_BYTES`): one row's attention buffers where :func:`bmm_attention_wanted`
    (:func:`attention_bmm`), reused by every row, layer and step, with ``attn_block = ~attn_mask``
    (True = hidden); else None.
    """

    rotations: Tensor
    attn_mask: Tensor | None
    query_drop: Tensor | None
    scores: Tensor | None = None
    probs: Tensor | None = None
    attn_block: Tensor | None = None

    @classmethod
    def for_mask(cls, mask: Tensor, rotary: RotaryEmbedding, heads: int, dtype: torch.dtype) -> DiTContext:
        """The context of ``mask (B, 1, T)`` (1 = real frame) for a DiT of ``heads`` heads in ``dtype``."""
        key_mask = mask.bool()  # (B, 1, T)
        padded = not bool(key_mask.all())  # without padding skip masks (faster attention, no masked_fill)
        attn_mask = key_mask.unsqueeze(1) if padded else None  # (B, 1, 1, T), broadcast over queries
        query_drop = ~key_mask[:, 0].unsqueeze(-1) if padded else None
        scores = probs = None
        t = mask.shape[-1]
        if bmm_attention_wanted(dtype, mask.device):
            group = max(1, min(heads, ATTENTION_BUFFER_BYTES // (6 * t * t)))  # float32 + bf16
            scores = torch.empty(group, t, t, dtype=torch.float32, device=mask.device)
            probs = torch.empty(group, t, t, dtype=dtype, device=mask.device)
        return cls(rotations=rotary.rotations(t), attn_mask=attn_mask, query_drop=query_drop, scores=scores,
                   probs=probs, attn_block=None if scores is None or attn_mask is None else ~attn_mask)


def attention_bmm(qkv: Tensor, heads: int, ctx: DiTContext) -> Tensor:
    """``qkv (B, T, 3 * H * Dh) -> (B, T, H * Dh)``: softmax attention as two batched GEMMs around
    an in-place softmax, one batch row at a time in ``ctx``'s buffers; bf16 inference on CPU.

    Why not SDPA there (:func:`bmm_attention_wanted`): without AMX torch's CPU flash kernel
    multiplies bf16 in small blocks, and on the DiT's shapes (T ~ 350, Dh = 64, 16 heads, a CFG
    pair) it ran no faster than in float32; on a 2-core AMD EPYC Zen 4 (AVX512-BF16, no AMX) this
    spelling took 0.73x its time on two threads (12.5 vs 17.1 ms, best of 60 on a loaded machine)
    and 0.93x on one (CPU time); ``benchmarks/bench_flow_gemm.py`` measures the whole flow. Precision
    as SDPA's kernel keeps it: the scores are float32 (q and k widened in the layout copy they need
    anyway; a bf16 product is exact in float32), the softmax runs in float32 and only the
    probabilities are rounded to bf16 for the second product. Scores rounded to bf16 before the
    softmax were measured 10x further from float32 than SDPA on logits of a trained model's size.
    fp32 keeps SDPA, byte for byte.

    One row (and for long rows a group of heads) at a time: the buffers stay (G, T, T) whatever the
    batch (a batch of 32 rows' scores would take about 250 MB at T = 350), a row's products do not
    depend on its companions, and the buffers are allocated once per inference (a fresh (T, T)
    tensor per layer costs page faults).
    """
    b, t, _ = qkv.shape
    scores, probs = ctx.scores, ctx.probs
    assert scores is not None and probs is not None
    x = qkv.view(b, t, 3, heads, -1)
    dh = x.shape[-1]
    group = scores.shape[0]  # heads per pass (all 16 at T ~ 350; fewer for long rows)
    out = torch.empty(b, t, heads, dh, dtype=qkv.dtype, device=qkv.device)
    for r in range(b):
        q, k = x[r, :, :2].permute(1, 2, 0, 3).to(torch.float32, memory_format=torch.contiguous_format)
        v = x[r, :, 2].transpose(0, 1).contiguous()  # (H, T, Dh)
        for h in range(0, heads, group):
            n = min(group, heads - h)
            s, p = scores[:n], probs[:n]
            torch.baddbmm(s, q[h:h + n], k[h:h + n].transpose(1, 2), beta=0.0, alpha=dh ** -0.5, out=s)
            if ctx.attn_block is not None:
                s.masked_fill_(ctx.attn_block[r], float("-inf"))  # (1, 1|T, T) over the heads
            torch.ops.aten._softmax.out(s, -1, False, out=s)
            p.copy_(s)
            out[r, :, h:h + n].copy_(torch.bmm(p, v[h:h + n]).transpose(0, 1))
    return out.view(b, t, heads * dh)


class Attention(FusedLinears):
    """Masked multi-head self-attention with F5-style rotary on full-width q/k; ``to_qkv`` fused."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.dim_head = dim_head
        self.to_qkv = self.fused_linear("to_qkv", dim, (("to_q", inner), ("to_k", inner), ("to_v", inner)),
                                        bias=True)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: Tensor, ctx: DiTContext) -> Tensor:
        """``x (B, T, D) -> (B, T, D)``; rows marked in ``ctx.query_drop`` come out zero."""
        b, t, _ = x.shape
        inner = self.heads * self.dim_head
        qkv = self.to_qkv(x)
        rotate_(qkv.view(b, t, 3, inner)[:, :, :2, :2 * ctx.rotations.shape[-1]], ctx.rotations)
        if ctx.probs is not None and qkv.dtype == ctx.probs.dtype and not torch.is_grad_enabled():
            out = attention_bmm(qkv, self.heads, ctx)
        else:
            q, k, v = (y.view(b, t, self.heads, self.dim_head).transpose(1, 2) for y in qkv.chunk(3, dim=-1))
            # SDPA, also on CPU in float32: its flash kernel was measured against bmm-softmax-bmm on
            # these shapes (T ~ 350, Dh = 64) and is as fast or faster, and it needs no (T, T) scores.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.attn_mask, dropout_p=0.0)
            out = out.transpose(1, 2).reshape(b, t, inner)  # a view on CPU (its kernel writes B, T, H, Dh)
        out = self.to_out[0](out)
        return cast(Tensor, out if ctx.query_drop is None else out.masked_fill_(ctx.query_drop, 0.0))
