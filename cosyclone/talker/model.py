"""CosyVoice3LM: a Qwen2 backbone plus the speech embedding and speech decoder head.

The module tree mirrors the official checkpoint so ``state_dict()`` keys equal ``llm.pt`` (and
``state_dicts/llm.json``) with no renaming: ``llm.model.model.{embed_tokens,layers.N,norm}``,
``speech_embedding``, ``llm_decoder``. There is deliberately **no** ``lm_head``: the released file
carries the tied ``llm.model.lm_head.weight``, which :func:`build_talker` accepts and ignores, and
the 151936-wide text logits are never computed (Hugging Face computes them every step; we don't).

Math (spec 3.2): pre-norm blocks, RMSNorm computed in fp32 and cast back before the weight,
half-split RoPE with theta from the config, GQA via ``F.scaled_dot_product_attention``, SwiGLU MLP,
biases on q/k/v only. The hidden state handed to ``llm_decoder`` is the final RMSNorm's output.
Decoder logits are raw (no log-softmax: the sampler's non-finite policy must see one NaN entry as
one entry, not a row turned NaN by the normalisation) and fp32: the speech-token head
(``llm_decoder``, 6761 x 896) keeps fp32 weights and runs in fp32 even when the backbone runs
bf16/fp16, because bf16 logits reorder near-tied candidates often enough to change sampled tokens
(``benchmarks/bench_dtype_agreement.py`` measures it).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import CheckpointKeyError, LoadReport, init_dummy, load_module_file
from ..config import QWEN_DIR, ModelConfig, QwenGeometry, TalkerConfig, validate_geometry
from ..device import DevicePolicy
from ..errors import ModelDirError
from ..fused import FusedLinears
from .kv_cache import KVCache

#: The tied text head the released ``llm.pt`` carries; accepted by the loader and never used.
TIED_LM_HEAD = "llm.model.lm_head.weight"
TIED_TO = "llm.model.model.embed_tokens.weight"  # the tensor TIED_LM_HEAD is a copy of in llm.pt


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


def rotate_half(x: Tensor) -> Tensor:
    """Half-split rotation: dims [0:D/2] and [D/2:D] of each head form the pairs."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


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
        self.qkv_proj = self.fused_linear("qkv_proj", g.hidden_size,
                                          (("q_proj", q_dim), ("k_proj", g.kv_dim), ("v_proj", g.kv_dim)), bias=True)
        self.o_proj = nn.Linear(q_dim, g.hidden_size, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, *,
                slots: Tensor | None, kv_len: int) -> Tensor:
        """``x`` (B, T, D); ``cos``/``sin`` (B, T, 1, Dh); ``mask`` (B, 1, T, S) bool (True = attend).

        Without a cache (``kv_cache is None``) attention runs over ``x`` itself. With a cache,
        ``slots is None`` means a prefill (T positions into slots 0..T-1) and otherwise ``slots``
        (B,) names the one slot per row written this step; attention reads slots ``0..kv_len-1``.
        """
        b, t, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv_proj(x).view(b, t, h + 2 * hkv, dh)
        qk = qkv[:, :, : h + hkv]  # q and k heads rotate together: one RoPE pass for both
        qk = qk * cos + rotate_half(qk) * sin
        q = qk[:, :, :h].transpose(1, 2)
        k = qk[:, :, h:].transpose(1, 2)
        v = qkv[:, :, h + hkv:].transpose(1, 2)
        cache = self.kv_cache
        if cache is not None:
            if slots is None:
                cache.write_prefix(k, v)
            else:
                cache.write_at(k, v, slots)
            k, v = cache.view(kv_len)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hkv != h)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, h * dh))


class MLP(FusedLinears):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases; ``gate_up_proj`` = ``[gate_proj; up_proj]``."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.gate_up_proj = self.fused_linear("gate_up_proj", g.hidden_size,
                                              (("gate_proj", g.intermediate_size), ("up_proj", g.intermediate_size)))
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); y = h + mlp(norm(h))``."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.self_attn = Attention(g)
        self.mlp = MLP(g)
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, *,
                slots: Tensor | None, kv_len: int) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, slots=slots, kv_len=kv_len)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen2Model(nn.Module):
    """The Qwen2 backbone (``llm.model.model``): token embedding, layers, final norm, RoPE tables."""

    def __init__(self, g: QwenGeometry) -> None:
        super().__init__()
        self.geometry = g
        self.embed_tokens = nn.Embedding(g.vocab_size, g.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(g) for _ in range(g.num_hidden_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.reset_rope()

    def reset_rope(self, length: int | None = None) -> None:
        """(Re)build the fp32 cos/sin tables (T, Dh) on the module's device.

        Called after ``to_empty`` (which leaves buffers uninitialised) and whenever more positions
        are needed. ``inv_freq_j = theta^(-2j/Dh)``; angles are ``pos * inv_freq`` in fp32.
        """
        g = self.geometry
        length = int(length or min(g.max_position_embeddings, 4096))
        dev = self.embed_tokens.weight.device
        dim = g.head_dim
        inv_freq = 1.0 / (g.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=dev).float() / dim))
        pos = torch.arange(length, device=dev, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rope_cos = emb.cos()
        self.rope_sin = emb.sin()

    def ensure_positions(self, length: int) -> None:
        """Grow the RoPE tables if a sequence needs more than ``length`` positions."""
        if length > self.rope_cos.shape[0]:
            if length > self.geometry.max_position_embeddings:
                raise ValueError(f"sequence of {length} positions exceeds max_position_embeddings="
                                 f"{self.geometry.max_position_embeddings}")
            self.reset_rope(max(length, 2 * self.rope_cos.shape[0]))

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor, *, slots: Tensor | None = None,
                kv_len: int = 0) -> Tensor:
        """``x`` (B, T, D) embeddings at ``positions`` (B, T) int64 -> post-norm hidden (B, T, D)."""
        cos = self.rope_cos[positions].to(x.dtype).unsqueeze(2)  # (B, T, 1, Dh): broadcast over heads
        sin = self.rope_sin[positions].to(x.dtype).unsqueeze(2)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, slots=slots, kv_len=kv_len)
        return self.norm(x)


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


class CosyVoice3LM(nn.Module):
    """The talker. ``speech_embedding``/``llm_decoder`` have ``speech_token_size + 200`` rows."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        validate_geometry(cfg)
        self.cfg = cfg
        self.geometry = cfg.qwen
        self.llm = Qwen2Encoder(cfg.qwen)
        self.llm_decoder = nn.Linear(cfg.llm_output_size, cfg.decoder_size, bias=False)
        self.speech_embedding = nn.Embedding(cfg.decoder_size, cfg.llm_input_size)

    # -- pieces ----------------------------------------------------------------------------------

    @property
    def backbone(self) -> Qwen2Model:
        return self.llm.model.model

    @property
    def device(self) -> torch.device:
        return self.llm_decoder.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """Run dtype of the backbone (and the KV cache); the speech-token head stays fp32."""
        return self.speech_embedding.weight.dtype

    def embed_text(self, ids: Tensor) -> Tensor:
        """Qwen2 token embedding (unscaled): (..., L) -> (..., L, D)."""
        return self.backbone.embed_tokens(ids)

    def embed_speech(self, ids: Tensor) -> Tensor:
        """Speech embedding rows (speech tokens and sos/task_id): (..., L) -> (..., L, D)."""
        return self.speech_embedding(ids)

    def assemble(self, text_ids: Tensor, prompt_speech_tokens: Tensor) -> Tensor:
        """One row's input: ``[sos, embed_tokens(text), task_id, speech_emb(prompt)]`` -> (T, D)."""
        dev = self.device
        sos = self.speech_embedding.weight[self.cfg.sos][None]
        task = self.speech_embedding.weight[self.cfg.task_id][None]
        parts = [sos, self.embed_text(text_ids.to(dev)), task]
        if prompt_speech_tokens.numel():
            parts.append(self.embed_speech(prompt_speech_tokens.to(dev)))
        return torch.cat(parts, dim=0)

    def decoder_logits(self, hidden: Tensor) -> Tensor:
        """Raw fp32 logits ``llm_decoder(h)``: (..., D) any dtype -> (..., S+200) fp32, unnormalised."""
        w = self.llm_decoder.weight
        return F.linear(hidden.to(w.dtype), w).float()

    # -- whole-sequence forward (no cache), for parity and tests ---------------------------------

    def forward(self, embeds: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Causal pass over ``embeds`` (B, T, D) (right-padded to ``lengths`` (B,)).

        Returns (post-norm hidden (B, T, D), fp32 decoder logits (B, T, S+200)). Does not touch the
        KV cache even when one is set up.
        """
        b, t, _ = embeds.shape
        dev = embeds.device
        self.backbone.ensure_positions(t)
        positions = torch.arange(t, device=dev).expand(b, t)
        mask = causal_mask(t, t, dev)
        if lengths is not None:
            mask = mask & (torch.arange(t, device=dev)[None, :] < lengths.to(dev)[:, None])[:, None, None, :]
        saved = [layer.self_attn.kv_cache for layer in self.backbone.layers]
        try:
            for layer in self.backbone.layers:
                layer.self_attn.kv_cache = None
            hidden = self.backbone(embeds, positions, mask.expand(b, 1, t, t))
        finally:
            for layer, cache in zip(self.backbone.layers, saved, strict=True):
                layer.self_attn.kv_cache = cache
        return hidden, self.decoder_logits(hidden)

    # -- cached decoding ---------------------------------------------------------------------------

    def setup_cache(self, batch: int, max_len: int) -> None:
        """Allocate every layer's KV cache (B, H_kv, max_len, Dh) in the model's dtype/device."""
        self.backbone.ensure_positions(max_len)
        for layer in self.backbone.layers:
            layer.self_attn.kv_cache = KVCache(self.geometry, batch, max_len, dtype=self.dtype, device=self.device)

    def clear_cache(self) -> None:
        """Drop the KV caches (frees their memory)."""
        for layer in self.backbone.layers:
            layer.self_attn.kv_cache = None

    def keep_cache_rows(self, index: Tensor) -> None:
        """Compact every layer's cache to the rows in ``index`` (b,)."""
        for layer in self.backbone.layers:
            assert layer.self_attn.kv_cache is not None
            layer.self_attn.kv_cache.keep_rows(index)

    def prefill(self, embeds: Tensor, lengths: Tensor) -> Tensor:
        """Fill the cache from right-padded ``embeds`` (B, T, D); return raw fp32 logits (B, V) at ``lengths-1``."""
        b, t, _ = embeds.shape
        dev = embeds.device
        positions = torch.arange(t, device=dev).expand(b, t)
        valid = torch.arange(t, device=dev)[None, :] < lengths[:, None]
        mask = causal_mask(t, t, dev) & valid[:, None, None, :]
        hidden = self.backbone(embeds, positions, mask, slots=None, kv_len=t)
        last = hidden[torch.arange(b, device=dev), lengths - 1]
        return self.decoder_logits(last)

    def step(self, embeds: Tensor, positions: Tensor, kv_len: int) -> Tensor:
        """One decode step: ``embeds`` (B, 1, D) at ``positions`` (B,) -> raw fp32 logits (B, V).

        Row b writes slot ``positions[b]`` and attends slots ``0..positions[b]``; ``kv_len`` (host
        int, ``max(positions)+1``) bounds the cache view so work grows with the longest row only.
        """
        dev = embeds.device
        mask = (torch.arange(kv_len, device=dev)[None, :] <= positions[:, None])[:, None, None, :]
        hidden = self.backbone(embeds, positions[:, None], mask, slots=positions, kv_len=kv_len)
        return self.decoder_logits(hidden[:, 0])


def causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Lower-triangular bool mask (1, 1, q_len, k_len) aligned at the end (True = attend)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]


def build_talker(cfg: ModelConfig, policy: DevicePolicy, load_format: str = "auto", *,
                 seed: int = 0) -> CosyVoice3LM:
    """Build the talker on ``policy.device`` in ``policy.dtype`` (its speech-token head in fp32).

    ``"auto"`` strict-loads ``<model_dir>/llm.pt`` (ignoring the tied lm_head copy); ``"dummy"``
    fills seeded random weights and never opens a file. The module is built on the meta device and
    materialised directly on the target device, so no full-size CPU copy is made first.
    """
    if load_format not in ("auto", "dummy"):
        raise ModelDirError(f"load_format must be 'auto' or 'dummy', not {load_format!r}")
    with torch.device("meta"):
        model = CosyVoice3LM(cfg.talker)
    model = model.to(dtype=policy.dtype)
    model.llm_decoder.to(torch.float32)  # the speech-token head runs fp32 in every run dtype (module doc)
    model = model.to_empty(device=policy.device)
    model.backbone.reset_rope()
    if load_format == "dummy":
        init_dummy(model, seed=seed)
    else:
        load_talker_weights(model, cfg.path("llm.pt"), qwen_config=cfg.path(f"{QWEN_DIR}/config.json"))
    return model.eval().requires_grad_(False)


def load_talker_weights(model: CosyVoice3LM, path: str | Path, *, qwen_config: str | Path | None = None) -> LoadReport:
    """Strict-load a ``.pt``/``.safetensors`` talker file (the tied lm_head copy, when present,
    must equal the embedding); a geometry mismatch names both files."""
    try:
        return load_module_file(model, path, tied={TIED_LM_HEAD: TIED_TO})
    except CheckpointKeyError as exc:
        if qwen_config is None or not exc.report.geometry_mismatch:
            raise
        g = model.geometry
        raise ModelDirError(
            f"{exc}\n  the model was built from {qwen_config} (hidden_size={g.hidden_size}, "
            f"num_hidden_layers={g.num_hidden_layers}, num_attention_heads={g.num_attention_heads}, "
            f"num_key_value_heads={g.num_key_value_heads}, intermediate_size={g.intermediate_size}); "
            f"{path} does not match that geometry") from exc
