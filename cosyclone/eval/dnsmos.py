"""DNSMOS: Microsoft's non-intrusive speech quality predictors (P.835 SIG, BAK, OVRL; P.808 MOS).

Why these: the filters that build training sets from found speech (Emilia-Pipe keeps DNSMOS OVRL >= 3.0)
judge a clip without a reference or a transcript, so a folder can be screened with no ASR at all.
The models are the ONNX files the ``speechmos`` wheel (MIT, part of the ``eval`` extra) ships in
``speechmos/dnsmos_models/``; only those files are used: its Python code imports ``librosa`` and
``requests`` without declaring them, so the models' inputs are computed here exactly as
``speechmos.dnsmos`` computes them (``tests/eval/test_eval_dnsmos.py`` compares the scores with its own):

* 16 kHz mono; a clip shorter than 9.01 s is doubled (appended to itself) until it is not;
* 9.01 s windows every second (``int((i + 9.01) * 16000)`` as the end, so a window that rounding
  leaves one sample short is skipped, as it is there);
* P.835 (``sig_bak_ovr.onnx``) reads the raw window and its three outputs go through the fixed
  third-order polynomials of the non-personalized model; P.808 (``model_v8.onnx``) reads the
  window less its last 160 samples as a 120-band Slaney mel power spectrogram (321-point periodic
  Hann frames every 160 samples, centred with zero padding, as librosa >= 0.10), in dB relative to
  its maximum floored 80 dB below it, then ``(dB + 40) / 40``;
* a clip's score is the mean over its windows.

The 16 kHz wave is the one eval scores everything on (the frontend's resampler); speechmos given a
file path resamples with librosa instead, so the comparison test feeds both the same array.

Windows of many rows are scored in one ONNX call (the batch dimension is free); onnxruntime runs
on the CPU's cores, or on CUDA's provider when the installed onnxruntime has it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cosyclone.eval.deps import EXTRA_HINT, EvalDependencyError
from cosyclone.eval.hashing import file_sha256

SAMPLE_RATE = 16000
WINDOW_S = 9.01  # seconds per scored window (the models' input)
WINDOW = int(WINDOW_S * SAMPLE_RATE)  # 144160 samples
HOP = SAMPLE_RATE  # one window per second of audio
N_FFT, MEL_HOP, N_MELS = 321, 160, 120  # P.808's mel: frame, hop (samples) and bands
TOP_DB, AMIN = 80.0, 1e-10  # the dB floor below the maximum, and the power floor
MODELS = {"p835": "sig_bak_ovr.onnx", "p808": "model_v8.onnx"}  # in speechmos/dnsmos_models/
# the non-personalized P.835 model's polynomials (highest power first): raw SIG, BAK, OVRL -> MOS
POLY_SIG = (-0.08397278, 1.22083953, 0.0052439)
POLY_BAK = (-0.13166888, 1.60915514, -0.39604546)
POLY_OVRL = (-0.06766283, 1.11546468, 0.04602535)
BATCH = 16  # windows per ONNX call

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class DnsmosScore:
    """One clip's DNSMOS (each on the 1..5 MOS scale, the mean over its 9.01 s windows)."""

    sig: float  # P.835 speech signal quality
    bak: float  # P.835 background noise (higher: less noise)
    ovrl: float  # P.835 overall quality (what --min-dnsmos judges)
    p808: float  # P.808 overall MOS
    windows: int  # 9.01 s windows scored


def models_dir() -> Path:
    """``speechmos``'s folder of DNSMOS ONNX models (found without importing its Python code)."""
    spec = find_spec("speechmos")
    if spec is None or not spec.submodule_search_locations:
        raise EvalDependencyError("DNSMOS needs the package 'speechmos' (its ONNX models), which is not "
                                  f"installed; install the eval extra: {EXTRA_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "dnsmos_models"
    missing = [name for name in MODELS.values() if not (folder / name).is_file()]
    if missing:
        raise EvalDependencyError(f"{folder} lacks {', '.join(missing)}: reinstall speechmos ({EXTRA_HINT})")
    return folder


def windows(wave16: FloatArray) -> FloatArray:
    """The clip's 9.01 s windows, (n, 144160), cut as ``speechmos.dnsmos`` cuts them."""
    audio = np.asarray(wave16, dtype=np.float32)
    if audio.size == 0:
        raise ValueError("an empty clip has no DNSMOS")
    while audio.size < WINDOW:
        audio = np.concatenate([audio, audio])
    hops = int(np.floor(audio.size / SAMPLE_RATE) - WINDOW_S) + 1
    cut = [audio[i * HOP:int((i + WINDOW_S) * HOP)] for i in range(hops)]
    kept = [w for w in cut if w.size >= WINDOW]
    return np.stack(kept) if kept else np.zeros((0, WINDOW), np.float32)


def _hz_to_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mel = hz / (200.0 / 3)
    log = hz >= 1000.0
    mel[log] = 15.0 + np.log(hz[log] / 1000.0) / (np.log(6.4) / 27.0)
    return mel


def _mel_to_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    hz = mel * (200.0 / 3)
    log = mel >= 15.0
    hz[log] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log] - 15.0))
    return hz


@lru_cache(maxsize=1)
def mel_filters() -> npt.NDArray[np.float64]:
    """(120, 161) Slaney-normalized triangular filters over 0..8 kHz (librosa's ``filters.mel``)."""
    freqs = np.fft.rfftfreq(N_FFT, d=1.0 / SAMPLE_RATE)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([8000.0]))[0],
                                   N_MELS + 2))
    width = np.diff(edges)
    ramps = edges[:, None] - freqs[None, :]
    rising = -ramps[:-2] / width[:-1, None]
    falling = ramps[2:] / width[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


@lru_cache(maxsize=1)
def _window() -> npt.NDArray[np.float64]:
    n = np.arange(N_FFT)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / N_FFT)  # periodic Hann


def p808_features(window: FloatArray) -> FloatArray:
    """(900, 120) P.808 input of one 9.01 s window: its mel dB scaled as ``speechmos`` scales it."""
    x = np.asarray(window[:-MEL_HOP], dtype=np.float64)
    padded = np.pad(x, N_FFT // 2)
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::MEL_HOP]
    power = np.abs(np.fft.rfft(frames * _window(), axis=1)) ** 2  # (frames, 161)
    mel = power @ mel_filters().T  # (frames, 120)
    db = 10.0 * np.log10(np.maximum(AMIN, mel)) - 10.0 * np.log10(max(AMIN, float(mel.max())))
    db = np.maximum(db, db.max() - TOP_DB)
    scaled: FloatArray = ((db + 40.0) / 40.0).astype(np.float32)
    return scaled


def providers() -> list[str]:
    """onnxruntime's providers for the models: CUDA's first when this onnxruntime has it."""
    import onnxruntime as ort

    have = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]


class Dnsmos:
    """The two DNSMOS sessions, scoring many clips' windows per call."""

    name = "dnsmos"

    def __init__(self, *, threads: int = 0) -> None:
        import onnxruntime as ort

        self.folder = models_dir()
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or min(8, os.cpu_count() or 1)
        self.providers = providers()
        self._p835 = ort.InferenceSession(str(self.folder / MODELS["p835"]), so, providers=self.providers)
        self._p808 = ort.InferenceSession(str(self.folder / MODELS["p808"]), so, providers=self.providers)

    def info(self) -> dict[str, Any]:
        """What scores.jsonl records about the models: files, their sha256, the providers."""
        return {"backend": "dnsmos (speechmos ONNX models)", "models": str(self.folder),
                "sha256": {name: file_sha256(self.folder / name) for name in MODELS.values()},
                "providers": self.providers}

    def score(self, waves16: Sequence[FloatArray]) -> list[DnsmosScore]:
        """Each 16 kHz clip's score (all clips' windows batched into the ONNX calls)."""
        cut = [windows(w) for w in waves16]
        stacked = np.concatenate(cut) if cut else np.zeros((0, WINDOW), np.float32)
        raw = np.zeros((stacked.shape[0], 3), np.float64)
        p808 = np.zeros(stacked.shape[0], np.float64)
        for start in range(0, stacked.shape[0], BATCH):
            part = np.ascontiguousarray(stacked[start:start + BATCH])
            raw[start:start + len(part)] = self._p835.run(None, {"input_1": part})[0]
            feats = np.stack([p808_features(w) for w in part])
            p808[start:start + len(part)] = self._p808.run(None, {"input_1": feats})[0][:, 0]
        sig = np.polyval(POLY_SIG, raw[:, 0])
        bak = np.polyval(POLY_BAK, raw[:, 1])
        ovrl = np.polyval(POLY_OVRL, raw[:, 2])
        out, at = [], 0
        for c in cut:
            span = slice(at, at + len(c))
            at += len(c)
            out.append(DnsmosScore(sig=float(sig[span].mean()), bak=float(bak[span].mean()),
                                   ovrl=float(ovrl[span].mean()), p808=float(p808[span].mean()),
                                   windows=len(c)))
        return out
