"""The flow's DiT estimator (CosyVoice3 ``DiT/dit.py`` + ``DiT/modules.py``), batched with masks.

Parameter names follow the released ``flow.pt`` under ``decoder.estimator.`` exactly. The only
persistent buffer is ``rotary_embed.inv_freq`` (x-transformers registers it persistently, so the
checkpoint carries it). Two details matter for parity (spec pitfalls 2 and 10):

* rotary is applied to the *full-width* q/k before the head split and only to its first
  ``dim_head`` channels, in interleaved-pair form: only head 0 is position-encoded;
* the input projection sees ``[x, cond, mu, spk]``; AdaLN chunks are shift/scale/gate (attn) then
  shift/scale/gate (MLP); the final AdaLN is (scale, shift).

For speed the three q/k/v projections are stored as one matrix ``to_qkv`` (see
:mod:`cosyclone.fused`); ``state_dict()``/``load_state_dict()`` keep the released ``to_q``/``to_k``/
``to_v`` names.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import DiTConfig
from ..fused import FusedLinears


class SinusTimeEmbedding(nn.Module):
    """``t (B,) -> (B, dim)``: 256-d sinusoid of ``1000 t`` (sin half first), then Linear-SiLU-Linear."""

    def __init__(self, dim: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        half = self.freq_dim // 2
        scale = math.log(10000) / (half - 1)
        freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * -scale)
        arg = 1000.0 * t.float().unsqueeze(1) * freqs.unsqueeze(0)
        emb = torch.cat([arg.sin(), arg.cos()], dim=-1).to(self.time_mlp[0].weight.dtype)
        return self.time_mlp(emb)


class CausalConvPositionEmbedding(nn.Module):
    """``(B, T, D) -> (B, T, D)``: two left-padded grouped convs (kernel 31, 16 groups), Mish each.

    Causal, so right padding of a batch never reaches a real frame.
    """

    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    """``[x, cond, mu, spk repeated] (B, T, 320) -> (B, T, D)`` plus the causal conv position embed."""

    def __init__(self, mel_dim: int, mu_dim: int, spk_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim)

    def forward(self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor) -> Tensor:
        spk = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat([x, cond, mu, spk], dim=-1))
        return self.conv_pos_embed(h) + h


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


def apply_rotary(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of full-width ``t (B, T, H*Dh)``, pairs (2j, 2j+1).

    Computed in float32 and cast back, as x-transformers does with autocast off. Writes the rotated
    channels into ``t`` in place (callers pass a fresh projection) instead of concatenating the
    full width again.
    """
    rot = cos.shape[-1]
    head = t[..., :rot].float()
    pairs = head.unflatten(-1, (-1, 2))
    rotated_half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    t[..., :rot] = (head * cos + rotated_half * sin).to(t.dtype)
    return t


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

    def forward(self, x: Tensor, attn_mask: Tensor | None, query_keep: Tensor | None, cos: Tensor,
                sin: Tensor) -> Tensor:
        """``x (B, T, D)``; ``attn_mask (B, 1, T|1, T)`` bool (True = attend) or None (no padding);
        ``query_keep (B, T, 1)`` bool or None (keep every output row)."""
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, self.heads, self.dim_head).transpose(1, 2) for y in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0)
        out = out.transpose(1, 2).reshape(b, t, self.heads * self.dim_head)
        out = self.to_out[0](out)
        return out if query_keep is None else out.masked_fill(~query_keep, 0.0)


class AdaLayerNormZero(nn.Module):
    """``Linear(SiLU(temb)) -> 6 chunks``: shift/scale/gate for attention, then for the MLP."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 6)


class AdaLayerNormZeroFinal(nn.Module):
    """``Linear(SiLU(temb)) -> (scale, shift)`` — note the order differs from the blocks'."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 2)


class FeedForward(nn.Module):
    """``Linear(D, 2D) -> GELU(tanh) -> Linear(2D, D)`` with keys ``ff.0.0`` / ``ff.2``."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = dim * mult
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
                                nn.Dropout(0.0), nn.Linear(inner, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.ff(x)


def _norm(x: Tensor) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


class DiTBlock(nn.Module):
    """AdaLN-zero block: ``x + gate_msa * attn(mod(LN x))``, then ``x + gate_mlp * ff(mod(LN x))``."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x: Tensor, temb_act: Tensor, attn_mask: Tensor | None, query_keep: Tensor | None, cos: Tensor,
                sin: Tensor) -> Tensor:
        """``x (B, T, D)``; ``temb_act = SiLU(temb) (B, D)``."""
        mods = self.attn_norm.linear(temb_act).unsqueeze(1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods.chunk(6, dim=-1)
        h = torch.addcmul(shift_msa, _norm(x), 1 + scale_msa)
        x = torch.addcmul(x, gate_msa, self.attn(h, attn_mask, query_keep, cos, sin))
        h = torch.addcmul(shift_mlp, _norm(x), 1 + scale_mlp)
        return torch.addcmul(x, gate_mlp, self.ff(h))


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


class DiT(nn.Module):
    """Estimator ``forward(x, mask, mu, t, spks, cond) -> (B, 80, T)``; channels-first like the CFM."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_embed = SinusTimeEmbedding(cfg.dim)
        self.input_embed = InputEmbedding(cfg.mel_dim, cfg.mu_dim, cfg.spk_dim, cfg.dim)
        self.rotary_embed = RotaryEmbedding(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(cfg.dim, cfg.heads, cfg.dim_head, cfg.ff_mult) for _ in range(cfg.depth)])
        self.norm_out = AdaLayerNormZeroFinal(cfg.dim)
        self.proj_out = nn.Linear(cfg.dim, cfg.out_channels)

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, *,
                streaming: bool = False) -> Tensor:
        """One velocity evaluation.

        Args:
            x, mu, cond: ``(B, 80, T)``; mask: ``(B, 1, T)`` (1 = real frame, right padding only
            matters through the key mask); t: ``(B,)`` or scalar; spks: ``(B, 80)``.
        Returns:
            ``(B, 80, T)`` in the module dtype.
        """
        dtype = self.proj_out.weight.dtype
        b, _, seq = x.shape
        x, mu, cond = (y.transpose(1, 2).to(dtype) for y in (x, mu, cond))
        if t.ndim == 0:
            t = t.expand(b)
        temb_act = F.silu(self.time_embed(t))
        h = self.input_embed(x, cond, mu, spks.to(dtype))
        freqs = self.rotary_embed.freqs(seq)
        cos, sin = freqs.cos(), freqs.sin()
        key_mask = mask.bool()  # (B, 1, T)
        padded = not bool(key_mask.all())  # without padding skip masks (faster SDPA, no masked_fill)
        attn_mask: Tensor | None = None
        query_keep: Tensor | None = None
        if streaming:
            attn_mask = chunk_mask(mask, self.cfg.static_chunk_size)
            query_keep = attn_mask[:, 0, -1].unsqueeze(-1) if padded else None
        elif padded:
            attn_mask = key_mask.unsqueeze(1)  # (B, 1, 1, T), broadcast over queries
            query_keep = key_mask[:, 0].unsqueeze(-1)
        for blk in self.transformer_blocks:
            h = blk(h, temb_act, attn_mask, query_keep, cos, sin)
        scale, shift = self.norm_out.linear(temb_act).unsqueeze(1).chunk(2, dim=-1)
        h = _norm(h) * (1 + scale) + shift
        return self.proj_out(h).transpose(1, 2)
