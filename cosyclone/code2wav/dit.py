"""The flow's DiT estimator (CosyVoice3 ``DiT/dit.py`` + ``DiT/modules.py``), batched with masks.

Parameter names follow the released ``flow.pt`` under ``decoder.estimator.`` exactly. The only
persistent buffer is ``rotary_embed.inv_freq`` (x-transformers registers it persistently, so the
checkpoint carries it). Two details matter for parity (spec pitfalls 2 and 10):

* rotary is applied to the *full-width* q/k before the head split and only to its first
  ``dim_head`` channels, in interleaved-pair form: only head 0 is position-encoded;
* the input projection sees ``[x, cond, mu, spk]``; AdaLN chunks are shift/scale/gate (attn) then
  shift/scale/gate (MLP); the final AdaLN is (scale, shift).

Attention (rotary, masks, the fused ``to_qkv`` and the kernel chosen per machine) lives in
:mod:`.dit_attention`; this module holds the layers whose arithmetic is the same everywhere.

Per-inference work is hoisted out of the Euler loop (:class:`DiTContext`, :meth:`DiT.modulations`);
with one time step shared by the whole batch (the solver's case) each AdaLN modulation is the
layer norm's own affine (one pass instead of norm + modulate), and inference updates the
residual stream and the GELU in place.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyclone.base import cpu_gemm
from cosyclone.code2wav.dit_attention import Attention, DiTContext, RotaryEmbedding
from cosyclone.model.config import DiTConfig


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
        first = self.time_mlp[0]
        assert isinstance(first, nn.Linear)
        out: Tensor = self.time_mlp(torch.cat([arg.sin(), arg.cos()], dim=-1).to(first.weight.dtype))
        return out


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
        return cast(Tensor, h.transpose(1, 2))


class InputEmbedding(nn.Module):
    """``[x, cond, mu, spk repeated] (B, T, 320) -> (B, T, D)`` plus the causal conv position embed."""

    def __init__(self, mel_dim: int, mu_dim: int, spk_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim)

    def forward(self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor) -> Tensor:
        spk = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat([x, cond, mu, spk], dim=-1))
        # Row-major result: the conv output is a transposed (channel-first) view, and a sum that
        # inherited its layout would make the whole residual stream channel-first (a copy in every
        # layer norm, strided residual updates).
        return cast(Tensor, (self.conv_pos_embed(h) + h).contiguous())


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
        if torch.is_grad_enabled():
            return cast(Tensor, self.ff(x))
        # Inference: GELU fused into the up-projection (oneDNN) or in place on its fresh output
        up = self.ff[0]
        assert isinstance(up, nn.Sequential) and isinstance(up[0], nn.Linear)
        return cast(Tensor, self.ff[2](cpu_gemm.linear_gelu_tanh(up[0], x)))


def _norm(x: Tensor) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


def _modulate(x: Tensor, shift: Tensor, scale1p: Tensor) -> Tensor:
    """``LN(x) * (1 + scale) + shift``; ``shift``/``scale1p`` are ``(D,)`` (one time step for the
    whole batch: folded into the layer norm's affine, one pass) or ``(B, D)`` (per row)."""
    if shift.ndim == 1:
        return F.layer_norm(x, (x.shape[-1],), scale1p, shift, eps=1e-6)
    return torch.addcmul(shift.unsqueeze(1), _norm(x), scale1p.unsqueeze(1))


def _residual(x: Tensor, gate: Tensor, y: Tensor) -> Tensor:
    """``x + gate * y`` (``gate (D,)`` or ``(B, D)``); in place on ``x`` when no autograd is
    recording (the DiT owns its residual stream: the input embedding is a fresh tensor)."""
    g = gate if gate.ndim == 1 else gate.unsqueeze(1)
    return torch.addcmul(x, g, y) if torch.is_grad_enabled() else x.addcmul_(g, y)


class DiTBlock(nn.Module):
    """AdaLN-zero block: ``x + gate_msa * attn(mod(LN x))``, then ``x + gate_mlp * ff(mod(LN x))``."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x: Tensor, mod: Tensor, ctx: DiTContext) -> Tensor:
        """``x (B, T, D)``; ``mod`` from :meth:`DiT.modulations`: ``(6, D)`` (shared) or ``(B, 6, D)``,
        rows shift/1+scale/gate (attention) then shift/1+scale/gate (MLP)."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.unbind(-2)
        x = _residual(x, gate_msa, self.attn(_modulate(x, shift_msa, scale_msa), ctx))
        return _residual(x, gate_mlp, self.ff(_modulate(x, shift_mlp, scale_mlp)))


class DiT(nn.Module):
    """Estimator ``forward(x, mask, mu, t, spks, cond) -> (B, 80, T)``; channels-first like the CFM.

    A solver that evaluates it many times splits the call: :meth:`context` (masks, rotary tables)
    and :meth:`modulations` (time embedding and every AdaLN projection, for all steps in one
    matmul per layer: those weights are read once per inference, not once per step) up front,
    then :meth:`velocity` per step.
    """

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

    def context(self, mask: Tensor) -> DiTContext:
        """Per-inference attention constants for ``mask (B, 1, T)`` (1 = real frame)."""
        return DiTContext.for_mask(mask, self.rotary_embed, self.cfg.heads, self.proj_out.weight.dtype)

    def modulations(self, t: Tensor) -> tuple[list[Tensor], Tensor]:
        """``t (S,)`` -> per block ``(S, 6, D)`` and final ``(S, 2, D)`` AdaLN rows, scale rows + 1.

        Row ``s`` serves every batch row at time ``t[s]``: the Euler solver passes all its steps'
        times at once (one matmul per layer over all steps), a per-row call passes ``t (B,)``.
        """
        temb_act = F.silu(self.time_embed(t))
        s, d = temb_act.shape
        blocks = []
        for blk in self.transformer_blocks:
            assert isinstance(blk, DiTBlock)
            m = blk.attn_norm.linear(temb_act).view(s, 6, d)
            m[:, 1].add_(1)
            m[:, 4].add_(1)
            blocks.append(m)
        final = self.norm_out.linear(temb_act).view(s, 2, d)
        final[:, 0].add_(1)
        return blocks, final

    def velocity(self, x: Tensor, mu: Tensor, spks: Tensor, cond: Tensor, ctx: DiTContext,
                 mods: tuple[list[Tensor], Tensor]) -> Tensor:
        """One velocity evaluation from prepared ``ctx`` and ``mods`` (one step's rows of
        :meth:`modulations`: ``(6, D)`` per block and ``(2, D)``, or per batch row with a leading B)."""
        dtype = self.proj_out.weight.dtype
        x, mu, cond = (y.transpose(1, 2).to(dtype) for y in (x, mu, cond))
        h = self.input_embed(x, cond, mu, spks.to(dtype))
        for blk, mod in zip(self.transformer_blocks, mods[0], strict=True):
            h = blk(h, mod, ctx)
        scale, shift = mods[1].unbind(-2)
        return cast(Tensor, self.proj_out(_modulate(h, shift, scale)).transpose(1, 2))

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor) -> Tensor:
        """One velocity evaluation.

        Args:
            x, mu, cond: ``(B, 80, T)``; mask: ``(B, 1, T)`` (1 = real frame, right padding only
            matters through the key mask); t: ``(B,)`` or scalar; spks: ``(B, 80)``.
        Returns:
            ``(B, 80, T)`` in the module dtype.
        """
        ctx = self.context(mask)
        if t.ndim == 0:
            blocks, final = self.modulations(t.reshape(1))
            mods = ([m[0] for m in blocks], final[0])
        else:
            mods = self.modulations(t.expand(x.shape[0]))
        return self.velocity(x, mu, spks, cond, ctx, mods)
