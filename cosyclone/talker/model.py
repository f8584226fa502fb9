"""CosyVoice3LM: a Qwen2 backbone plus the speech embedding and speech decoder head.

The module tree mirrors the official checkpoint so ``state_dict()`` keys equal ``llm.pt`` (and
``state_dicts/llm.json``) with no renaming: ``llm.model.model.{embed_tokens,layers.N,norm}``,
``speech_embedding``, ``llm_decoder``. There is deliberately **no** ``lm_head``: the released file
carries the tied ``llm.model.lm_head.weight``, which :func:`build_talker` accepts and ignores, and
the 151936-wide text logits are never computed (Hugging Face computes them every step; we don't).

The backbone (spec 3.2) is :mod:`cosyclone.talker.qwen2`; the hidden state handed to ``llm_decoder`` is its
final RMSNorm's output. Decoder logits are raw (no log-softmax: the sampler's non-finite policy must see one
NaN entry as one entry, not a row turned NaN by the normalisation) and fp32: the speech-token head
(``llm_decoder``, 6761 x 896) keeps fp32 weights and runs in fp32 even when the backbone runs bf16/fp16,
because bf16 logits reorder near-tied candidates often enough to change sampled tokens
(``benchmarks/bench_dtype_agreement.py`` measures it).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from cosyclone.base import cpu_gemm
from cosyclone.base.device import DevicePolicy
from cosyclone.errors import ModelDirError
from cosyclone.model.checkpoint import CheckpointKeyError, LoadReport, init_dummy, load_module_file
from cosyclone.model.config import QWEN_DIR, ModelConfig, TalkerConfig, validate_geometry
from cosyclone.options import DEFAULT_LLM, LoadFormat
from cosyclone.talker.kv_cache import SlotKVCache
from cosyclone.talker.qwen2 import Admission, Qwen2Encoder, Qwen2Model, attention_mask

#: The tied text head the released ``llm.pt`` carries; accepted by the loader and never used.
TIED_LM_HEAD = "llm.model.lm_head.weight"
TIED_TO = "llm.model.model.embed_tokens.weight"  # the tensor TIED_LM_HEAD is a copy of in llm.pt


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
        self.kv_cache: SlotKVCache | None = None  # see setup_cache; holds non-persistent buffers only

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
        return cast(Tensor, self.backbone.embed_tokens(ids))

    def embed_speech(self, ids: Tensor) -> Tensor:
        """Speech embedding rows (speech tokens and sos/task_id): (..., L) -> (..., L, D)."""
        return cast(Tensor, self.speech_embedding(ids))

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
        return cast(Tensor, self.llm_decoder(hidden.to(self.llm_decoder.weight.dtype)).float())

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
        hidden = self.backbone(embeds, positions, attention_mask(positions, t, lengths))
        return hidden, self.decoder_logits(hidden)

    # -- cached decoding ---------------------------------------------------------------------------

    @property
    def cache(self) -> SlotKVCache:
        if self.kv_cache is None:
            raise RuntimeError("no KV cache: call setup_cache(slots, capacity) first")
        return self.kv_cache

    def new_cache(self, slots: int, capacity: int) -> SlotKVCache:
        """A slot cache (L, slots, H_kv, capacity, Dh) in the model's dtype/device, owned by the caller.

        A decode engine holds its own and passes it to :meth:`prefill`/:meth:`step`, so two decodes
        on one model (a talker session spanning a run and a row retried alone) never share cells.
        """
        self.backbone.ensure_positions(capacity)
        return SlotKVCache(self.geometry, slots, capacity, dtype=self.dtype, device=self.device)

    def setup_cache(self, slots: int, capacity: int) -> SlotKVCache:
        """Allocate the model's own slot cache (what prefill/step use when given none)."""
        self.kv_cache = self.new_cache(slots, capacity)
        return self.kv_cache

    def clear_cache(self) -> None:
        """Drop the KV cache (frees its memory)."""
        self.kv_cache = None

    def prefill(self, embeds: Tensor, lengths: Tensor, slots: Tensor | None = None, *,
                cache: SlotKVCache | None = None) -> Tensor:
        """Fill ``cache`` (default the model's) ``slots`` (B,) (default 0..B-1) from right-padded
        ``embeds`` (B, T, D).

        Sets those slots' lengths and returns raw fp32 logits (B, V) at ``lengths-1``.
        """
        b, t, _ = embeds.shape
        dev = embeds.device
        cache = self.cache if cache is None else cache
        slots = torch.arange(b, device=dev) if slots is None else slots.to(dev)
        positions = torch.arange(t, device=dev).expand(b, t)
        mask = attention_mask(positions, t, lengths)
        hidden = self.backbone(embeds, positions, mask, cache=cache, slots=slots)
        cache.lengths[slots] = lengths.to(dev)
        last = hidden[torch.arange(b, device=dev), lengths - 1]
        return self.decoder_logits(last)

    def step(self, embeds: Tensor, positions: Tensor, kv_len: int | None = None, *,
             cache: SlotKVCache | None = None, admit: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        """One fixed-shape decode step: ``embeds`` (slots, 1, D) at ``positions`` (slots,) -> logits (slots,
        V).

        Slot s of ``cache`` (default the model's) writes cell ``positions[s]`` and attends cells
        ``0..positions[s]``. ``kv_len`` (a host int, default the capacity) bounds the cells read:
        any value above every position gives the same result, so a caller can bucket it without a
        device read.

        ``admit``: (right-padded prompts (b, T, D), lengths (b,), free slots (b,)) prefilled in the
        same pass (:class:`Admission`): those slots get their prompts' cells and lengths, and their
        rows of the result are the logits at each prompt's last position, as :meth:`prefill` gives.
        """
        cache = self.cache if cache is None else cache
        k = cache.capacity if kv_len is None else int(kv_len)
        pos = positions[:, None]
        # The additive form of the mask, made once: SDPA turns a bool mask into exactly this
        # (0 where True, -inf elsewhere, in the query dtype) in every layer otherwise;
        # log(1) = 0 and log(0) = -inf exactly: two ops for the whole conversion.
        mask = attention_mask(pos, k).to(embeds.dtype).log()
        if admit is None:
            hidden = self.backbone(embeds, pos, mask, cache=cache, decode=True)
            return self.decoder_logits(hidden[:, 0])
        prompts, lengths, slots = admit
        b, t, d = prompts.shape
        s = embeds.shape[0]
        prompt_pos = torch.arange(t, device=embeds.device).expand(b, t)
        plan = Admission(slots=slots, mask=attention_mask(prompt_pos, t, lengths))
        flat = torch.cat((embeds.reshape(s, d), prompts.reshape(b * t, d)))[None]
        hidden = self.backbone(flat, torch.cat((positions, prompt_pos.reshape(-1)))[None], mask, cache=cache,
                               decode=True, admit=plan)[0]
        cache.lengths[slots] = lengths
        last = hidden[s:].view(b, t, d)[torch.arange(b, device=embeds.device), lengths - 1]
        logits = self.decoder_logits(torch.cat((hidden[:s], last)))
        return logits[:s].index_copy(0, slots, logits[s:])


def build_talker(cfg: ModelConfig, policy: DevicePolicy, load_format: LoadFormat = "auto", *,
                 seed: int = 0, llm: str = DEFAULT_LLM) -> CosyVoice3LM:
    """Build the talker on ``policy.device`` in ``policy.dtype`` (its speech-token head in fp32).

    ``"auto"`` strict-loads ``<model_dir>/<llm>`` (``llm.pt``, or ``llm.rl.pt``, the RL-tuned talker of the
    same architecture; the tied lm_head copy ignored); ``"dummy"``
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
        load_talker_weights(model, cfg.talker_file(llm), qwen_config=cfg.path(f"{QWEN_DIR}/config.json"))
    cpu_gemm.apply(model, policy.cpu_gemm)
    return model.eval().requires_grad_(False)


def load_talker_weights(
    model: CosyVoice3LM, path: str | Path, *, qwen_config: str | Path | None = None
) -> LoadReport:
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
