"""The flow's DiT estimator (CosyVoice3 ``DiT/dit.py`` + ``DiT/modules.py``), batched with masks.

Parameter names follow the released ``flow.pt`` under ``decoder.estimator.`` exactly. The only
persistent buffer is ``rotary_embed.inv_freq`` (x-transformers registers it persistently, so the
checkpoint carries it). Two details matter for parity (spec pitfalls 2 and 10):

* rotary is applied to the *full-width* q/k before the head split and only to its first
  ``dim_head`` channels, in interleaved-pair form: only head 0 is position-encoded;
* the input projection sees ``[x, cond, mu, spk]``; AdaLN chunks are shift/scale/gate (attn) then
  shift/scale/gate (MLP); the final AdaLN is (scale, shift).

For speed the three q/k/v projections are stored as one matrix ``to_qkv`` (see
:mod:`cosyclone.model.fused`); ``state_dict()``/``load_state_dict()`` keep the released ``to_q``/``to_k``/
``to_v`` names.

Per-inference work is hoisted out of the Euler loop (:class:`DiTContext`, :meth:`DiT.modulations`);
with one time step shared by the whole batch (the solver's case) each AdaLN modulation is the
layer norm's own affine (one pass instead of norm + modulate), and inference updates the
residual stream and the GELU in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyclone.base import cpu_gemm
from cosyclone.model.config import DiTConfig
from cosyclone.model.fused import FusedLinears


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
        # Row-major result: the conv output is a transposed (channel-first) view, and a sum that
        # inherited its layout would make the whole residual stream channel-first (a copy in every
        # layer norm, strided residual updates).
        return (self.conv_pos_embed(h) + h).contiguous()


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
        torch.view_as_complex(head.unflatten(-1, (-1, 2))).mul_(rotations)
        return
    pairs = head.to(torch.float32, memory_format=torch.contiguous_format).unflatten(-1, (-1, 2))
    head.copy_(torch.view_as_real(torch.view_as_complex(pairs) * rotations).flatten(-2))


@dataclass(frozen=True)
class DiTContext:
    """Per-inference constants of the DiT (the same at every Euler step): built once by
    :meth:`DiT.context` instead of at each velocity evaluation.

    ``rotations``: rotary table (:meth:`RotaryEmbedding.rotations`); ``attn_mask (B, 1, T|1, T)``
    bool, True = attend; ``query_drop (B, T, 1)`` bool marks padded query rows whose output is
    zeroed; both None without padding. ``scores (G, T, T)`` float32 and ``probs (G, T, T)`` in the
    model dtype, G heads at a time (:data:`ATTENTION_BUFFER_BYTES`): one row's attention buffers where :func:`bmm_attention_wanted` (:func:`attention_bmm`),
    reused by every row, layer and step, with ``attn_block = ~attn_mask`` (True = hidden); else None.
    """

    rotations: Tensor
    attn_mask: Tensor | None
    query_drop: Tensor | None
    scores: Tensor | None = None
    probs: Tensor | None = None
    attn_block: Tensor | None = None


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
    return dtype == torch.bfloat16 and device.type == "cpu" and not torch.is_grad_enabled() and not cpu_has_amx()


def attention_bmm(qkv: Tensor, heads: int, ctx: DiTContext) -> Tensor:
    """``qkv (B, T, 3 * H * Dh) -> (B, T, H * Dh)``: softmax attention as two batched GEMMs around
    an in-place softmax, one batch row at a time in ``ctx``'s buffers; bf16 inference on CPU.

    Why not SDPA there (:func:`bmm_attention_wanted`): without AMX torch's CPU flash kernel
    multiplies bf16 in small blocks, and on the DiT's shapes (T ~ 350, Dh = 64, 16 heads, a CFG
    pair) it ran no faster than in float32; on a 2-core AMD EPYC Zen 4 (AVX512-BF16, no AMX) this
    spelling took 0.73x its time on two threads (12.5 vs 17.1 ms, best of 60 on a loaded machine)
    and 0.93x on one (CPU time); ``benchmarks/bench_flow_gemm.py`` measures the whole flow. Precision as SDPA's kernel keeps it: the scores are float32 (q and k
    widened in the layout copy they need anyway; a bf16 product is exact in float32), the softmax
    runs in float32 and only the probabilities are rounded to bf16 for the second product. Scores
    rounded to bf16 before the softmax were measured 10x further from float32 than SDPA on logits
    of a trained model's size. fp32 keeps SDPA, byte for byte.

    One row (and for long rows a group of heads) at a time: the buffers stay (G, T, T) whatever the batch (a batch of 32 rows' scores
    would take about 250 MB at T = 350), a row's products do not depend on its companions, and the
    buffers are allocated once per inference (a fresh (T, T) tensor per layer costs page faults).
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
                s.masked_fill_(ctx.attn_block[r], float("-inf"))  # (1, T|1, T) over the heads
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
        return out if ctx.query_drop is None else out.masked_fill_(ctx.query_drop, 0.0)


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
            return self.ff(x)
        # Inference: GELU fused into the up-projection (oneDNN) or in place on its fresh output
        return self.ff[2](cpu_gemm.linear_gelu_tanh(self.ff[0][0], x))


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

    def context(self, mask: Tensor, *, streaming: bool = False) -> DiTContext:
        """Per-inference constants for ``mask (B, 1, T)`` (1 = real frame)."""
        key_mask = mask.bool()  # (B, 1, T)
        padded = not bool(key_mask.all())  # without padding skip masks (faster attention, no masked_fill)
        attn_mask: Tensor | None = None
        query_keep: Tensor | None = None
        if streaming:
            attn_mask = chunk_mask(mask, self.cfg.static_chunk_size)
            query_keep = attn_mask[:, 0, -1].unsqueeze(-1) if padded else None
        elif padded:
            attn_mask = key_mask.unsqueeze(1)  # (B, 1, 1, T), broadcast over queries
            query_keep = key_mask[:, 0].unsqueeze(-1)
        scores = probs = None
        dtype, t = self.proj_out.weight.dtype, mask.shape[-1]
        if bmm_attention_wanted(dtype, mask.device):
            group = max(1, min(self.cfg.heads, ATTENTION_BUFFER_BYTES // (6 * t * t)))  # float32 + bf16
            scores = torch.empty(group, t, t, dtype=torch.float32, device=mask.device)
            probs = torch.empty(group, t, t, dtype=dtype, device=mask.device)
        return DiTContext(rotations=self.rotary_embed.rotations(t), attn_mask=attn_mask,
                          query_drop=None if query_keep is None else ~query_keep, scores=scores, probs=probs,
                          attn_block=None if scores is None or attn_mask is None else ~attn_mask)

    def modulations(self, t: Tensor) -> tuple[list[Tensor], Tensor]:
        """``t (S,)`` -> per block ``(S, 6, D)`` and final ``(S, 2, D)`` AdaLN rows, scale rows + 1.

        Row ``s`` serves every batch row at time ``t[s]``: the Euler solver passes all its steps'
        times at once (one matmul per layer over all steps), a per-row call passes ``t (B,)``.
        """
        temb_act = F.silu(self.time_embed(t))
        s, d = temb_act.shape
        blocks = []
        for blk in self.transformer_blocks:
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
        return self.proj_out(_modulate(h, shift, scale)).transpose(1, 2)

    def forward(self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, *,
                streaming: bool = False) -> Tensor:
        """One velocity evaluation.

        Args:
            x, mu, cond: ``(B, 80, T)``; mask: ``(B, 1, T)`` (1 = real frame, right padding only
            matters through the key mask); t: ``(B,)`` or scalar; spks: ``(B, 80)``.
        Returns:
            ``(B, 80, T)`` in the module dtype.
        """
        ctx = self.context(mask, streaming=streaming)
        if t.ndim == 0:
            blocks, final = self.modulations(t.reshape(1))
            mods = ([m[0] for m in blocks], final[0])
        else:
            mods = self.modulations(t.expand(x.shape[0]))
        return self.velocity(x, mu, spks, cond, ctx, mods)
