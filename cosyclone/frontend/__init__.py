"""Frontend: prompt audio + texts → per-segment :class:`~cosyclone.frontend.conditioning.Request` s.

Prompt features (tokens, CAM++ embedding, flow mel) are computed once per row and shared by all
of its segments. Modules: audio (load/resample), features (mels, fbank), onnx (sessions),
text (tokenizer, what the LLM reads per mode), normalize (the official text normalization),
prompt_cache (prompt features cached by audio content), tiny_assets (test stand-ins).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from cosyclone.frontend import prompt_cache
from cosyclone.frontend.audio import PromptBytes, check_prompt, load_audio, resample
from cosyclone.frontend.conditioning import LLM_PROMPT_MODES, Request
from cosyclone.frontend.features import align_prompt, flow_mel
from cosyclone.frontend.onnx import OnnxModels
from cosyclone.frontend.prompt_cache import LRUCache, audio_digest
from cosyclone.frontend.text import TextFrontend
from cosyclone.model.config import QWEN_DIR, ModelConfig
from cosyclone.options import Mode, TextFrontendName

__all__ = ["Frontend", "PromptBytes", "PromptFeatures"]

#: A prompt as the frontend takes it: a file, a file's bytes read elsewhere, or an in-memory (wave, rate).
PromptAudio = str | Path | PromptBytes | tuple[torch.Tensor, int]


class PromptFeatures(dict[str, torch.Tensor]):
    """{"speech_token": (P,) long, "speech_feat": (2P, 80) float32, "embedding": (192,) float32}."""


class Frontend:
    """Builds conditioning for the talker/flow from a model directory's ONNX models and tokenizer."""

    def __init__(self, cfg: ModelConfig, providers: list[str] | None = None, *,
                 text_frontend: TextFrontendName = "wetext",
                 prompt_cache_entries: int = prompt_cache.DEFAULT_ENTRIES) -> None:
        self.cfg = cfg
        self.text = TextFrontend(cfg.path(QWEN_DIR), text_frontend=text_frontend,  # fails first when unusable
                                 prompt_cache_entries=prompt_cache_entries)
        self.onnx = OnnxModels(cfg.path("campplus.onnx").parent, providers)
        # prompt audio content -> features; the frontend settings and providers shape them too
        self.prompt_cache: LRUCache[PromptFeatures] = LRUCache(prompt_cache_entries)
        self._settings = repr((cfg.frontend, providers))
        # prompt files read by another process (a Ray driver ships them to its actors), by path as the
        # manifest resolved it: such a path is decoded from these bytes, not opened here
        self.prompt_bytes: Mapping[str, bytes] = {}

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Hits, misses and entries of the prompt-audio and prompt-text caches."""
        return {"prompt_audio": self.prompt_cache.stats(), "prompt_text": self.text.prompt_ids_cache.stats()}

    def prompt_features(self, prompt_audio: PromptAudio, *, row_id: str | None = None) -> PromptFeatures:
        """Prompt wave (path, shipped bytes or (wave (N,), sr)) → aligned tokens, flow mel and speaker
        embedding.

        Computed once per distinct prompt content (:mod:`~cosyclone.frontend.prompt_cache`); each
        call gets its own copies, so no caller can change what later rows read. A path found in
        :attr:`prompt_bytes` is read from there: the same content, so the same features and cache key.
        """
        if isinstance(prompt_audio, str | Path) and self.prompt_bytes:
            data = self.prompt_bytes.get(str(prompt_audio))
            if data is not None:
                prompt_audio = PromptBytes(str(prompt_audio), data)
        if not self.prompt_cache.max_entries:
            return self._compute_prompt_features(prompt_audio, row_id=row_id)
        try:
            key = (audio_digest(prompt_audio), self._settings)
        except OSError:  # unreadable: the loader raises the error that names the row
            return self._compute_prompt_features(prompt_audio, row_id=row_id)
        feats = self.prompt_cache.get_or_compute(
            key, lambda: self._compute_prompt_features(prompt_audio, row_id=row_id))
        return PromptFeatures({k: v.clone() for k, v in feats.items()})

    def _compute_prompt_features(
        self, prompt_audio: PromptAudio, *, row_id: str | None = None
    ) -> PromptFeatures:
        fe = self.cfg.frontend
        if isinstance(prompt_audio, tuple):
            wave, sr = prompt_audio
            wave = wave.to(torch.float32).reshape(-1) if wave.dim() == 1 else wave.to(torch.float32).mean(0)
            check_prompt(wave, sr, row_id=row_id, min_sr=fe.min_prompt_sample_rate,
                         max_seconds=fe.max_prompt_seconds)
        else:
            wave, sr = load_audio(prompt_audio, row_id=row_id, min_sr=fe.min_prompt_sample_rate,
                                  max_seconds=fe.max_prompt_seconds)
        w16 = resample(wave, sr, 16000)
        w24 = resample(wave, sr, fe.sample_rate)
        tokens = self.onnx.speech_tokens(w16)
        embedding = self.onnx.speaker_embedding(w16)
        m = fe.mel
        mel, _ = flow_mel(w24[None], n_fft=m.n_fft, num_mels=m.num_mels, sampling_rate=m.sampling_rate,
                          hop_size=m.hop_size, win_size=m.win_size, fmin=m.fmin, fmax=m.fmax)
        feat, tokens = align_prompt(mel[0].T.contiguous(), tokens, fe.token_mel_ratio)
        return PromptFeatures(speech_token=tokens, speech_feat=feat, embedding=embedding)

    def prepare(self, row_id: str, prompt_audio: PromptAudio,
                prompt_text: str | None, text: str, mode: Mode = "zero_shot", instruct: str | None = None,
                seed: int = 0, speed: float = 1.0, *, max_len_ratio: float | None = None,
                features: PromptFeatures | None = None) -> list[Request]:
        """One :class:`Request` per target segment; text is checked before any audio work.

        Each Request carries its segment's normalized text (``segment_text``) and target id count
        (``target_len``), so the run record shows what the model read. A segment that could
        overflow the LLM's positions is refused here, before the talker (at the model's max length
        ratio, or ``max_len_ratio`` when the run overrides it). ``features``: this prompt's
        :meth:`prompt_features`, already computed (by a prompt worker ahead of the talker).
        """
        plan = self.text.plan(mode, prompt_text, text, instruct, row_id=row_id)
        feats = features if features is not None else self.prompt_features(prompt_audio, row_id=row_id)
        llm_speech = int(feats["speech_token"].numel()) if mode in LLM_PROMPT_MODES else 0
        talker = self.cfg.talker
        ratio = talker.max_len_ratio if max_len_ratio is None else max_len_ratio
        plan.check_fit(max_positions=talker.qwen.max_position_embeddings, max_len_ratio=ratio,
                       prompt_speech_tokens=llm_speech, row_id=row_id)
        out = []
        for i, seg in enumerate(plan.segments):
            ids = torch.tensor(plan.prompt_ids + seg.ids, dtype=torch.long)
            out.append(Request(row_id=row_id, segment=i, text_ids=ids, target_len=len(seg.ids),
                               embed=dict(feats), seed=seed, speed=speed, mode=mode, segment_text=seg.text))
        return out
