"""Batched Whisper transcription with faster-whisper from a local CTranslate2 model directory.

Why not ``WhisperModel.transcribe`` row by row: a dataset folder holds thousands of short clips,
and faster-whisper batches only the chunks of *one* long file. Here rows of up to 30 s are padded
to Whisper's 30 s window and encoded and decoded together (``batch_size`` rows a call), each with
its own language token; a row longer than 30 s goes through faster-whisper's long-form
``transcribe`` on its own. Decoding is beam search without timestamps and without temperature
fallback, so a transcript is a deterministic function of (audio, model, options).

Nothing is downloaded unless asked: ``model`` must be a directory holding ``model.bin``,
``config.json`` and ``tokenizer.json`` (faster-whisper would otherwise fetch a tokenizer from the
hub); with ``download=True`` a model name (``large-v3``) is fetched by faster-whisper.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.errors import CosycloneError
from cosyclone.eval.deps import require
from cosyclone.eval.hashing import file_sha256

SAMPLE_RATE = 16000
WINDOW_SECONDS = 30.0  # Whisper's input window: longer rows take the long-form path
MODEL_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.json", "vocabulary.txt",
               "preprocessor_config.json")


@dataclass(frozen=True)
class AsrOptions:
    """How transcripts are made."""

    model: str  # local CTranslate2 Whisper directory (or a model name when download is True)
    download: bool = False  # allow faster-whisper to fetch a named model from the hub
    device: str = "auto"  # auto | cpu | cuda (CTranslate2 device)
    compute_type: str = "auto"
    # CTranslate2 compute type; auto = int8 on CPU, the weights' own precision on GPU
    beam_size: int = 5  # beam width (faster-whisper's default; 1 = greedy)
    batch_size: int = 8  # rows encoded/decoded per call
    cpu_threads: int = 0  # CTranslate2 intra-op threads on CPU (0 = the machine's cores, at most 8)
    language: str | None = None  # force this language for every row (None: from the row, else detected)


@dataclass(frozen=True)
class Transcript:
    """One row's transcript."""

    text: str  # decoded text, special tokens removed
    language: str  # language the decoder was prompted with
    language_source: str  # forced | row | english-only model | detected
    language_probability: float | None  # detector's probability when detected


class WhisperASR:
    """A faster-whisper model and the batched decoding loop around it."""

    def __init__(self, options: AsrOptions) -> None:
        fw = require("faster_whisper", purpose="ASR")
        self.options = options
        path = Path(options.model).expanduser()
        if path.is_dir():
            missing = [f for f in ("model.bin", "config.json", "tokenizer.json") if not (path / f).is_file()]
            if missing:
                raise CosycloneError(f"--asr-model {path} is not a CTranslate2 Whisper directory: missing "
                                     f"{', '.join(missing)} (convert a Whisper model with "
                                     "ct2-transformers-converter --copy_files tokenizer.json)")
            source = str(path.resolve())
        elif options.download:
            source = options.model
        else:
            raise CosycloneError(f"--asr-model {options.model}: no such directory (give a local CTranslate2 "
                                 "Whisper directory; nothing is downloaded unless --asr-download is given)")
        threads = options.cpu_threads or min(8, os.cpu_count() or 1)
        self.device = options.device
        if self.device == "auto":
            import ctranslate2

            self.device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        # On CPU a float16 checkpoint would run in float32, 2.6x slower than int8 on the test fixture
        # (tiny.en, 2 cores); --compute-type default scores in the weights' own precision anywhere.
        self.compute_type = options.compute_type
        if self.compute_type == "auto":
            self.compute_type = "int8" if self.device == "cpu" else "default"
        try:
            self._model = fw.WhisperModel(source, device=self.device, compute_type=self.compute_type,
                                          cpu_threads=threads, local_files_only=not options.download)
        except Exception as exc:  # CTranslate2 raises RuntimeError/ValueError for bad dirs or devices
            raise CosycloneError(f"cannot load the ASR model {source}: {exc}") from exc
        self.model_path = Path(getattr(self._model.model, "model_path", source) or source)
        self.multilingual = bool(self._model.model.is_multilingual)
        self.supported = set(self._model.supported_languages)
        self._fw = fw
        self._tokenizers: dict[str, Any] = {}

    def info(self) -> dict[str, Any]:
        """What scores.jsonl records about the ASR: backend, versions, path, options and file hashes."""
        folder = Path(self.options.model).expanduser()
        files = [folder / f for f in MODEL_FILES] if folder.is_dir() else []
        hashes = {p.name: file_sha256(p) for p in files if p.is_file()}
        return {"backend": "faster-whisper", "faster_whisper": getattr(self._fw, "__version__", None),
                "model": str(folder.resolve()) if folder.is_dir() else self.options.model,
                "multilingual": self.multilingual, "sha256": hashes, "beam_size": self.options.beam_size,
                "compute_type": self.compute_type, "device": self.device, "language": self.options.language}

    def _tokenizer(self, language: str) -> Any:
        tok = self._tokenizers.get(language)
        if tok is None:
            from faster_whisper.tokenizer import Tokenizer

            tok = Tokenizer(self._model.hf_tokenizer, self.multilingual, task="transcribe",
                            language=language if self.multilingual else "en")
            self._tokenizers[language] = tok
        return tok

    def _language(self, hint: str | None) -> tuple[str | None, str]:
        """(language to prompt with or None = detect, its source)."""
        if not self.multilingual:
            return "en", "english-only model"
        if self.options.language:
            return self.options.language, "forced"
        if hint and hint in self.supported:
            return hint, "row"
        return None, "detected"

    def transcribe(self, waves: list[np.ndarray], hints: list[str | None]) -> list[Transcript]:
        """Transcribe 16 kHz mono waves (N,) float32; ``hints`` are the rows' languages (None = unknown)."""
        out: list[Transcript | None] = [None] * len(waves)
        short = [i for i, w in enumerate(waves) if w.size / SAMPLE_RATE <= WINDOW_SECONDS]
        for i in sorted(set(range(len(waves))) - set(short)):
            out[i] = self._long_form(waves[i], hints[i])
        bs = max(1, self.options.batch_size)
        for start in range(0, len(short), bs):
            idx = short[start:start + bs]
            for i, t in zip(idx, self._batch([waves[i] for i in idx], [hints[i] for i in idx]), strict=True):
                out[i] = t
        return [t for t in out if t is not None]

    def _batch(self, waves: list[np.ndarray], hints: list[str | None]) -> list[Transcript]:
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.transcribe import get_suppressed_tokens

        fe = self._model.feature_extractor
        # (B, n_mels, 3000): each row's log-mel padded to the 30 s window, as faster-whisper's batched path
        feats = np.stack(
            [pad_or_trim(fe(np.ascontiguousarray(w, dtype=np.float32))[..., :-1]) for w in waves]
        )
        encoded = self._model.encode(feats)
        chosen = [self._language(h) for h in hints]
        detected: list[tuple[str, float]] = []
        if any(lang is None for lang, _ in chosen):
            detected = [
                (str(res[0][0])[2:-2], float(res[0][1])) for res in self._model.model.detect_language(encoded)
            ]
        prompts, langs = [], []
        for b, (lang, source) in enumerate(chosen):
            prob = None
            if lang is None:
                lang, prob = detected[b]
            tok = self._tokenizer(lang)
            prompts.append([*tok.sot_sequence, tok.no_timestamps])
            langs.append((lang, source, prob, tok))
        results = self._model.model.generate(
            encoded, prompts, beam_size=self.options.beam_size, max_length=self._model.max_length,
            suppress_blank=True, suppress_tokens=list(get_suppressed_tokens(langs[0][3], [-1])))
        return [
            Transcript(
                text=tok.decode(res.sequences_ids[0]).strip(),
                language=lang,
                language_source=source,
                language_probability=prob,
            )
            for res, (lang, source, prob, tok) in zip(results, langs, strict=True)
        ]

    def _long_form(self, wave: np.ndarray, hint: str | None) -> Transcript:
        lang, source = self._language(hint)
        segments, info = self._model.transcribe(np.ascontiguousarray(wave, dtype=np.float32), language=lang,
                                                beam_size=self.options.beam_size, temperature=0.0,
                                                condition_on_previous_text=False, vad_filter=False)
        text = " ".join(s.text.strip() for s in segments).strip()
        return Transcript(text=text, language=info.language if lang is None else lang, language_source=source,
                          language_probability=float(info.language_probability) if lang is None else None)
