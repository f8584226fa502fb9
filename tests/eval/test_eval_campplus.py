"""CAM++ speaker similarity through the model directory's campplus.onnx.

The project's tiny CAM++ (cosyclone/frontend/tiny_assets.py) has random weights, so its
similarities mean nothing: these tests check only shapes, determinism and that eval feeds it
exactly what the frontend feeds it. Discrimination between voices is tested with Resemblyzer's
pretrained weights in test_eval_models.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from cosyclone.errors import CosycloneError
from cosyclone.eval.speaker import CampplusEncoder, build_encoder, cosine

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "eval_espeak"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cosyclone.frontend.tiny_assets import write_tiny_onnx

    d = tmp_path_factory.mktemp("tiny-onnx")
    write_tiny_onnx(d)
    return d


def _wave(name: str) -> np.ndarray:
    return sf.read(str(FIXTURE / name), dtype="float32")[0]


def test_tiny_campplus_gives_192_dims_deterministically(tiny_dir: Path, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("COSYCLONE_CACHE_DIR", str(tmp_path))
    enc = build_encoder("campplus", model_dir=tiny_dir)
    a, b = _wave("wavs/a1.wav"), _wave("wavs/b1.wav")
    ea, ea2, eb = enc.embed(a), enc.embed(a.copy()), enc.embed(b)
    assert ea.shape == (192,) and ea.dtype == np.float32 and np.isfinite(ea).all()
    assert np.array_equal(ea, ea2) and not np.array_equal(ea, eb)
    assert cosine(ea, ea2) == pytest.approx(1.0) and -1.0 <= cosine(ea, eb) <= 1.0
    assert len(enc.info()["sha256"]) == 64


def test_eval_embeds_exactly_what_the_frontend_conditions_on(tiny_dir: Path):
    from cosyclone.frontend.onnx import OnnxModels

    wave = _wave("prompts/voice_a.wav")
    frontend = OnnxModels(tiny_dir, providers=["CPUExecutionProvider"]).speaker_embedding(
        torch.from_numpy(wave)
    )
    ours = CampplusEncoder(tiny_dir / "campplus.onnx", providers=["CPUExecutionProvider"]).embed(wave)
    assert np.array_equal(frontend.numpy(), ours)


def test_campplus_without_a_model_dir_is_a_clear_error(tmp_path: Path):
    with pytest.raises(CosycloneError, match="--model-dir"):
        build_encoder("campplus")
    with pytest.raises(CosycloneError, match="campplus.onnx"):
        build_encoder("campplus", model_dir=tmp_path)
    with pytest.raises(CosycloneError, match="must be one of"):
        build_encoder("wavlm")
