"""The Qwen2 backbone of the talker (``llm.model.model``): attention over the slot KV cache,
MLP, RMSNorm, RoPE, and the one mask rule.

Split from :mod:`cosyclone.talker.model` (the talker around it: speech embedding and decoder head,
prompt assembly, prefill and step, building and loading) because this part is plain Qwen2 and is
read on its own against the reference; module names mirror the official checkpoint
(``llm.model.model.{embed_tokens,layers.N,norm}``) so state-dict keys need no renaming.

Math (spec 3.2): pre-norm blocks, RMSNorm computed in fp32 and cast back before the weight,
half-split RoPE with theta from the config, GQA via ``F.scaled_dot_product_attention`` (the prefill
in bounded query chunks on an accelerator: :func:`prefill_attention`), SwiGLU MLP, biases on q/k/v
only. The hidden state handed on is the final RMSNorm's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyclone.model.config import QwenGeometry
from cosyclone.model.fused import FusedLinears
from cosyclone.talker.kv_cache import SlotKVCache


@dataclass(frozen=True)
class CacheContext:
    """What one attention layer needs to use the slot cache: the cache, its layer index, and
    either the prefill's target ``slots`` (b,) or the decode step's ``positions`` (slots,)."""

    cache: SlotKVCache
    layer: int
    slots: Tensor | None = None
    positions: Tensor | None = None
    rows: Tensor | None = None  # decode: arange(slots), made once per step for every layer's KV write
    admit: Admission | None = None  # a decode step that also prefills newcomers (see Admission)


@dataclass(frozen=True)
class Admission:
    """Newcomers prefilled in the same pass as a decode step (``CosyVoice3LM.step(admit=...)``).

    Why: on a CPU a decode step is bound by reading the weights once, so a prompt sent through the
    linear layers beside the step's one token per slot costs only its own arithmetic, where a
    separate prefill reads every weight a second time. The pass is flat, (1, slots + b*T, D): the
    step's rows first, then the newcomers' right-padded prompts; only attention tells them apart.
    """

    slots: Tensor  # (b,) int64 target slots (free: not running in the step)
    mask: Tensor
    # (b, 1, T, T) bool causal and padding mask of the prompts (attention_mask): b newcomers, T cells


class RMSNorm(nn.Module):
    """Qwen2 RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps))``, normalised in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # one fused kernel instead of five elementwise ops (49 norms per decode step)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * h.to(x.dtype)


def swap_halves(x: Tensor) -> Tensor:
    """``[x2, x1]``: the half-split RoPE rotation ``[-x2, x1]`` (dims [0:D/2] and [D/2:D] of each
    head form the pairs) without its negation, which the signed sin table carries (``(-a) * s ==
    a * (-s)`` exactly, so the rotation is bit-identical and one op shorter)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, x1), dim=-1)


class Attention(FusedLinears):
    """GQA self-attention (q: H heads, k/v: H_kv heads, head_dim D), q/k/v biases, no o bias.

    ``qkv_proj`` holds ``[q_proj; k_proj; v_proj]`` (checkpoint names restored by hooks).
    """

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.n_heads = g.num_attention_heads
        self.n_kv = g.num_key_value_heads
        self.head_dim = g.head_dim
        q_dim = g.num_attention_heads * g.head_dim
        self.qkv_proj = self.fused_linear(
            "qkv_proj",
            g.hidden_size,
            (("q_proj", q_dim), ("k_proj", g.kv_dim), ("v_proj", g.kv_dim)),
            bias=True,
        )
        self.o_proj = nn.Linear(q_dim, g.hidden_size, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, ctx: CacheContext | None = None
    ) -> Tensor:
        """``x`` (B, T, D); ``cos``/``sin`` (B, T, 1, Dh), ``sin`` signed (:attr:`Qwen2Model.rope_table`);
        ``mask`` (B, 1, T, K), bool (True = attend) or the equal additive float mask (0 / -inf).

        Without ``ctx`` attention runs over ``x`` itself. A prefill context (``ctx.slots`` set)
        also writes this layer's K/V into cells ``0..T-1`` of those slots. A decode context
        (``ctx.positions`` set, T == 1, one row per slot) writes each slot's new K/V at its
        position and attends over the cache's first K cells.
        """
        b, t, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv_proj(x).view(b, t, h + 2 * hkv, dh)
        qk = qkv[:, :, : h + hkv]  # q and k heads rotate together: one RoPE pass for both
        qk = qk * cos + swap_halves(qk) * sin
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + hkv:]  # (b, t, heads, dh) each
        if ctx is not None and ctx.admit is not None:  # flat (1, S + b'T): the step's rows, then prompts
            s = ctx.cache.slots
            # writes first: a free
            step = self._step(q[0, :s, None], k[0, :s, None], v[0, :s, None], mask, ctx)
            # slot's step row may land inside the newcomer's prompt cells, which the prefill then rewrites
            n, length = ctx.admit.mask.shape[0], ctx.admit.mask.shape[-1]
            pre = self._prefill(q[0, s:].view(n, length, -1, dh), k[0, s:].view(n, length, -1, dh),
                                v[0, s:].view(n, length, -1, dh), ctx.admit.mask, ctx, ctx.admit.slots)
            y = torch.cat((step.reshape(s, -1), pre.reshape(n * length, -1)))[None]
        elif ctx is not None and ctx.positions is not None:
            y = self._step(q, k, v, mask, ctx)
        else:
            y = self._prefill(q, k, v, mask, ctx, None if ctx is None else ctx.slots)
        out: Tensor = self.o_proj(y)
        return out

    def _step(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, ctx: CacheContext) -> Tensor:
        """One query per slot, (slots, 1, heads, dh): write each slot's K/V at its position, attend
        over the cache's first ``mask.shape[-1]`` cells -> (slots, 1, H*dh)."""
        b, h, hkv, dh = q.shape[0], self.n_heads, self.n_kv, self.head_dim
        assert ctx.positions is not None, "a decode context carries the slots' positions"
        ctx.cache.write_step(ctx.layer, k.transpose(1, 2), v.transpose(1, 2), ctx.positions, rows=ctx.rows)
        keys, values = ctx.cache.view(ctx.layer, mask.shape[-1])
        # The H/H_kv query heads that share a K/V head become that head's "query positions", so no
        # GQA flag is needed and a masked fused kernel applies.
        y = F.scaled_dot_product_attention(q.reshape(b, hkv, h // hkv, dh), keys, values, attn_mask=mask)
        return y.reshape(b, 1, h * dh)

    def _prefill(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, ctx: CacheContext | None,
                 slots: Tensor | None) -> Tensor:
        """Causal attention over the rows themselves, (b, T, heads, dh) -> (b, T, H*dh); with
        ``slots`` (b,) their K/V are written into cells ``0..T-1`` of those slots."""
        b, t = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if ctx is not None and slots is not None:
            ctx.cache.write_prefix(ctx.layer, k, v, slots)
        bound = None if q.device.type == "cpu" else PREFILL_SCORES  # CPU: SDPA's flash kernel holds no scores
        y = prefill_attention(q, k, v, mask, gqa=self.n_kv != self.n_heads, max_scores=bound)
        return y.transpose(1, 2).reshape(b, t, -1)


#: The most attention scores (rows x heads x query positions x key cells) one prefill attention call
#: may hold on an accelerator: 2^26 fp32 scores, 256 MiB (SDPA's math kernel also holds their
#: softmax and the float mask: about three times that). See :func:`prefill_attention`.
PREFILL_SCORES = 1 << 26

Attend = Callable[..., Tensor]


def prefill_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, gqa: bool, max_scores: int | None,
                      attend: Attend = F.scaled_dot_product_attention) -> Tensor:
    """Masked attention of a prefill, (b, H, T, dh) queries over (b, H_kv, K, dh) keys -> (b, H, T, dh),
    in query chunks whose scores (b x H x rows x K) stay within ``max_scores`` (None: one call).

    Why chunks: with GQA and a mask (causal and per-row lengths) SDPA on CUDA falls back to its
    math kernel (flash takes no mask and no fp32), which builds every (T, K) score: b x 14 x T x T
    fp32 for a whole admission, gigabytes at 30 s prompts. A chunk of query rows attends over all K
    keys with its own mask rows, so each row's arithmetic is the one-call arithmetic, the kernel is
    the one the parity tests pinned, and the memory is bounded whatever the admission. On CPU SDPA
    takes its flash kernel (mask and GQA included), which holds no scores: one call, bytes as they were.
    """
    b, h, t = q.shape[:3]
    rows = t if max_scores is None else max(1, max_scores // max(1, b * h * k.shape[2]))
    if rows >= t:
        return attend(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return torch.cat([attend(q[:, :, i:i + rows], k, v, attn_mask=mask[:, :, i:i + rows], enable_gqa=gqa)
                      for i in range(0, t, rows)], dim=2)


class MLP(FusedLinears):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases; ``gate_up_proj`` = ``[gate_proj; up_proj]``."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.gate_up_proj = self.fused_linear(
            "gate_up_proj",
            g.hidden_size,
            (("gate_proj", g.intermediate_size), ("up_proj", g.intermediate_size)),
        )
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out: Tensor = self.down_proj(F.silu(gate) * up)
        return out


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); y = h + mlp(norm(h))``."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.self_attn = Attention(g)
        self.mlp = MLP(g)
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, ctx: CacheContext | None = None
    ) -> Tensor:
        h: Tensor = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, ctx)
        out: Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class Qwen2Model(nn.Module):
    """The Qwen2 backbone (``llm.model.model``): token embedding, layers, final norm, RoPE tables."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.geometry = g
        self.embed_tokens = nn.Embedding(g.vocab_size, g.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(g) for _ in range(g.num_hidden_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        # [cos | sin with its first half negated] (T, 2 Dh), fp32: one gather per pass for both
        # tables, and the sign of the rotation is applied once here instead of per layer (swap_halves)
        self.register_buffer("rope_table", torch.empty(0), persistent=False)
        self.reset_rope()

    def reset_rope(self, length: int | None = None) -> None:
        """(Re)build the fp32 RoPE table (T, 2 Dh) on the module's device.

        Called after ``to_empty`` (which leaves buffers uninitialised) and whenever more positions
        are needed. ``inv_freq_j = theta^(-2j/Dh)``; angles are ``pos * inv_freq`` in fp32.
        """
        g = self.geometry
        length = int(length or min(g.max_position_embeddings, 4096))
        dev = self.embed_tokens.weight.device
        dim = g.head_dim
        inv_freq = 1.0 / (
            g.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=dev).float() / dim)
        )
        pos = torch.arange(length, device=dev, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin, half = emb.sin(), dim // 2
        self.rope_table = torch.cat((emb.cos(), -sin[:, :half], sin[:, half:]), dim=-1)

    def ensure_positions(self, length: int) -> None:
        """Grow the RoPE tables if a sequence needs more than ``length`` positions."""
        if length > self.rope_table.shape[0]:
            if length > self.geometry.max_position_embeddings:
                raise ValueError(f"sequence of {length} positions exceeds max_position_embeddings="
                                 f"{self.geometry.max_position_embeddings}")
            self.reset_rope(max(length, 2 * self.rope_table.shape[0]))

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor, *, cache: SlotKVCache | None = None,
                slots: Tensor | None = None, decode: bool = False, admit: Admission | None = None) -> Tensor:
        """``x`` (B, T, D) embeddings at ``positions`` (B, T) int64 -> post-norm hidden (B, T, D).

        With ``cache``: ``slots`` (B,) makes this a prefill into those slots; ``decode`` a step
        with one row per slot (T == 1) at ``positions[:, 0]``; ``decode`` with ``admit`` a step
        whose rows come first in a flat (1, slots + b*T) pass, the newcomers' prompts after them.
        """
        # (B, T, 1, Dh) each: broadcast over heads; sin is the signed table (see swap_halves)
        cos, sin = self.rope_table[positions].to(x.dtype).unsqueeze(2).chunk(2, dim=-1)
        step_pos = rows = None
        if decode:
            assert cache is not None, "a decode step reads the slot cache"
            step_pos = positions[:, 0] if admit is None else positions[0, :cache.slots]
            rows = torch.arange(step_pos.shape[0], device=x.device)
        for i, layer in enumerate(self.layers):
            ctx = (
                None
                if cache is None
                else CacheContext(cache, i, slots=slots, positions=step_pos, rows=rows, admit=admit)
            )
            x = layer(x, cos, sin, mask, ctx)
        out: Tensor = self.norm(x)
        return out


class Qwen2ForCausalLMBody(nn.Module):
    """``llm.model``: holds ``model`` only; the tied text head is intentionally absent."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.model = Qwen2Model(g)


class Qwen2Encoder(nn.Module):
    """``llm``: the official wrapper's name level (``llm.model.model.*``)."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.model = Qwen2ForCausalLMBody(g)


def attention_mask(positions: Tensor, kv_len: int, lengths: Tensor | None = None) -> Tensor:
    """The one mask rule: query at position p attends key cell j iff ``j <= p`` (and ``j < length``).

    ``positions`` (B, T) int64, ``lengths`` (B,) or None -> (B, 1, T, kv_len) bool (True = attend).
    Causal prefill, padded whole-sequence passes and decode steps all use it.
    """
    keys = torch.arange(kv_len, device=positions.device)
    mask = keys[None, None, :] <= positions[:, :, None]
    if lengths is not None:
        mask = mask & (keys[None, :] < lengths.to(positions.device)[:, None])[:, None, :]
    return mask[:, None]
