"""Speaker similarity: the cosine of speaker embeddings of the prompt audio and the output.

Two backends, both scored on 16 kHz mono audio:

* ``campplus``: the model directory's own ``campplus.onnx`` (the CAM++ encoder whose 192-d
  embedding conditions the flow), fed exactly the frontend's features (Kaldi fbank, 80 bins,
  mean-normalized) through :func:`cosyclone.frontend.onnx.campplus_embedding`. It answers "does
  the output carry the speaker the model was told to clone", in the model's own terms.
* ``resemblyzer``: an independent pretrained encoder, the GE2E speaker encoder whose weights ship
  in the ``resemblyzer`` wheel (``pretrained.pt``). The package's own import path needs
  ``webrtcvad``, whose module no longer imports with current setuptools (it imports
  ``pkg_resources``), so the network (3-layer LSTM 40->256, linear 256, ReLU, L2 norm) and its
  input (40-bin power mel, 25 ms Hann window, 10 ms hop) are implemented here in torch and the
  shipped weights loaded into it. Differences from ``resemblyzer.preprocess_wav``: leading and
  trailing silence is trimmed by frame energy (-40 dBFS) instead of webrtcvad, and pauses inside
  the utterance are kept. Utterance embedding as in Resemblyzer: 1.6 s partials at 1.3 per second,
  last partial kept when 75 % covered, the mean of their embeddings L2-normalized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import nn

from cosyclone.errors import CosycloneError
from cosyclone.eval.hashing import file_sha256

SAMPLE_RATE = 16000
BACKENDS = ("campplus", "resemblyzer")


class SpeakerEncoder(Protocol):
    """Maps a 16 kHz wave to a speaker embedding."""

    name: str

    def embed(self, wave16: np.ndarray) -> np.ndarray:
        """(N,) float32 at 16 kHz -> (D,) float32."""
        ...

    def info(self) -> dict[str, Any]:
        """Backend, weights path and sha256 (recorded in scores.jsonl)."""
        ...


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two vectors (0.0 when either is all zeros)."""
    a64, b64 = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    denom = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64) / denom if denom > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# CAM++ (the model directory's campplus.onnx)


class CampplusEncoder:
    """CAM++ embeddings from ``campplus.onnx`` through the frontend's own feature code."""

    name = "campplus"

    def __init__(self, onnx_path: str | Path, providers: list[str] | None = None) -> None:
        from cosyclone.frontend.onnx import get_session

        self.path = Path(onnx_path)
        if not self.path.is_file():
            raise CosycloneError(
                f"speaker model campplus needs {self.path} (give --model-dir, the CosyVoice3 "
                "model directory that holds campplus.onnx)"
            )
        self._session = get_session(self.path, providers)

    def embed(self, wave16: np.ndarray) -> np.ndarray:
        from cosyclone.frontend.onnx import campplus_embedding

        wave = torch.from_numpy(np.ascontiguousarray(wave16, dtype=np.float32))
        return campplus_embedding(self._session, wave).numpy()

    def info(self) -> dict[str, Any]:
        return {"backend": self.name, "model": str(self.path.resolve()), "sha256": file_sha256(self.path)}


# ---------------------------------------------------------------------------------------------
# Resemblyzer's pretrained GE2E encoder


@dataclass(frozen=True)
class ResemblyzerConfig:
    """Geometry and framing of the encoder the shipped weights were trained with."""

    n_mels: int = 40  # mel channels of the input
    n_fft: int = 400  # 25 ms window at 16 kHz
    hop: int = 160  # 10 ms hop
    hidden: int = 256  # LSTM width
    layers: int = 3  # LSTM depth
    embedding: int = 256  # output dims
    partial_frames: int = 160  # 1.6 s per partial utterance
    partials_per_second: float = 1.3  # partial rate along the utterance
    min_coverage: float = 0.75  # keep the last partial when this much of it is real audio
    target_dbfs: float = -30.0  # quiet input is raised to this level (never lowered)
    trim_db: float = -40.0  # frame energy under which leading/trailing audio is trimmed


class _GE2E(nn.Module):
    """LSTM stack -> last layer's final hidden state -> linear -> ReLU -> L2 norm."""

    def __init__(self, cfg: ResemblyzerConfig) -> None:
        super().__init__()
        self.lstm = nn.LSTM(cfg.n_mels, cfg.hidden, cfg.layers, batch_first=True)
        self.linear = nn.Linear(cfg.hidden, cfg.embedding)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels (B, frames, n_mels) -> (B, embedding), unit L2 norm."""
        _, (h, _) = self.lstm(mels)
        e = torch.relu(self.linear(h[-1]))
        return cast(torch.Tensor, e / e.norm(dim=1, keepdim=True).clamp_min(1e-12))


def resemblyzer_weights() -> Path:
    """``pretrained.pt`` inside the installed resemblyzer package, found without importing it."""
    from importlib.util import find_spec

    from cosyclone.eval.deps import EXTRA_HINT, EvalDependencyError

    spec = find_spec("resemblyzer")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / "pretrained.pt"
        if path.is_file():
            return path
    raise EvalDependencyError(
        f"speaker model resemblyzer needs the package 'resemblyzer' (its wheel ships the "
        f"weights); install the eval extra: {EXTRA_HINT}"
    )


class ResemblyzerEncoder:
    """Resemblyzer's pretrained speaker encoder (weights from its wheel, network and features here)."""

    name = "resemblyzer"

    def __init__(
        self, weights: str | Path | None = None, cfg: ResemblyzerConfig = ResemblyzerConfig()
    ) -> None:
        from cosyclone.frontend.features import slaney_mel_filterbank

        self.cfg = cfg
        self.path = Path(weights) if weights is not None else resemblyzer_weights()
        from cosyclone.model.checkpoint import load_torch_data

        try:  # weights-only; a refusal names the object type, never advises unsafe loading
            ckpt = load_torch_data(self.path, mmap=False)
        except CosycloneError as exc:
            raise CosycloneError(f"cannot read Resemblyzer weights: {exc}") from None
        state = ckpt.get("model_state", ckpt) if isinstance(ckpt, dict) else ckpt
        if not isinstance(state, dict):
            raise CosycloneError(
                f"cannot read Resemblyzer weights: {self.path} holds {type(state).__name__}, not a state dict"
            )
        self.net = _GE2E(cfg).eval()
        own = {k: v for k, v in state.items() if k.startswith(("lstm.", "linear."))}
        self.net.load_state_dict(own, strict=True)
        self._fb = slaney_mel_filterbank(SAMPLE_RATE, cfg.n_fft, cfg.n_mels)  # (n_mels, 1 + n_fft // 2)
        self._window = torch.hann_window(cfg.n_fft, periodic=True)

    def info(self) -> dict[str, Any]:
        return {"backend": self.name, "model": str(self.path.resolve()), "sha256": file_sha256(self.path)}

    def preprocess(self, wave16: np.ndarray) -> np.ndarray:
        """Raise quiet audio to ``target_dbfs`` and trim leading/trailing silence: (N,) -> (M,)."""
        x = np.nan_to_num(np.asarray(wave16, dtype=np.float64).reshape(-1))
        rms = math.sqrt(float(np.mean(x ** 2))) if x.size else 0.0
        if rms > 0:
            gain_db = self.cfg.target_dbfs - 20.0 * math.log10(rms)
            if gain_db > 0:
                x = x * 10.0 ** (gain_db / 20.0)
        frame = self.cfg.hop
        n = (x.size // frame) * frame
        if n:
            frame_rms = np.sqrt((x[:n].reshape(-1, frame) ** 2).mean(axis=1))
            loud = np.flatnonzero(frame_rms >= 10.0 ** (self.cfg.trim_db / 20.0))
            if loud.size:
                x = x[loud[0] * frame:(loud[-1] + 1) * frame]
        return x.astype(np.float32)

    def mel(self, wave16: np.ndarray) -> torch.Tensor:
        """(N,) -> power mel (1 + N // hop, n_mels): centred frames, zero-padded edges, Slaney mel."""
        x = torch.from_numpy(np.ascontiguousarray(wave16, dtype=np.float32))
        spec = torch.stft(x, self.cfg.n_fft, hop_length=self.cfg.hop, window=self._window, center=True,
                          pad_mode="constant", return_complex=True).abs() ** 2
        return (self._fb @ spec).T.contiguous()

    def partial_starts(self, n_samples: int) -> list[int]:
        """First mel frame of each partial utterance covering ``n_samples`` samples."""
        c = self.cfg
        n_frames = math.ceil((n_samples + 1) / c.hop)
        step = max(1, round(SAMPLE_RATE / c.partials_per_second / c.hop))
        last = max(1, n_frames - c.partial_frames + step + 1)
        starts = list(range(0, last, step))
        covered = (n_samples - starts[-1] * c.hop) / (c.partial_frames * c.hop)
        if covered < c.min_coverage and len(starts) > 1:
            starts.pop()
        return starts

    @torch.inference_mode()
    def embed(self, wave16: np.ndarray) -> np.ndarray:
        x = self.preprocess(wave16)
        if x.size == 0:
            return np.zeros(self.cfg.embedding, dtype=np.float32)
        starts = self.partial_starts(x.size)
        need = (starts[-1] + self.cfg.partial_frames) * self.cfg.hop
        if need > x.size:
            x = np.pad(x, (0, need - x.size))
        mel = self.mel(x)
        parts = torch.stack([mel[s:s + self.cfg.partial_frames] for s in starts])  # (P, frames, n_mels)
        e = self.net(parts).mean(dim=0)
        return cast("np.ndarray", (e / e.norm().clamp_min(1e-12)).numpy().astype(np.float32))


def build_encoder(name: str, *, model_dir: Path | None = None) -> SpeakerEncoder:
    """The speaker backend called ``name`` (campplus needs the CosyVoice3 ``model_dir``)."""
    if name == "campplus":
        if model_dir is None:
            raise CosycloneError("speaker model campplus needs --model-dir (the CosyVoice3 model directory)")
        return CampplusEncoder(Path(model_dir) / "campplus.onnx")
    if name == "resemblyzer":
        return ResemblyzerEncoder()
    raise CosycloneError(f"--speaker-model must be one of {', '.join(BACKENDS)} or none, not {name!r}")
