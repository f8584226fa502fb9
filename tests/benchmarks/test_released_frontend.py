"""The frontend of the released geometry (benchmarks/released_frontend.py), built for real at one
tokenizer block (the released twelve take a minute): both files load through the product's own
sessions and give what the frontend reads from the released ones (tokens of the v3 codebook about a
quarter of the whisper frames, a 192-dim embedding), the export keeps the torch module's tokens,
and the measurement runs distinct prompts through the real Frontend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from benchmarks import released_frontend as rf
from cosyclone.frontend.onnx import OnnxModels


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("released")
    facts = rf.build(folder, layers=1)
    assert facts["tokenizer_layers"] == 1 and facts["built_s"] > 0
    return folder


def test_both_files_have_the_released_signatures(built: Path) -> None:
    facts = json.loads((built / rf.MARKER).read_text())
    assert 6.5e6 < facts["campplus_weights"] < 7.5e6  # CAM++: the released campplus.onnx is ~28 MB of fp32
    assert facts["bytes"]["campplus.onnx"] > 25 << 20
    assert rf.build(built, layers=1)["built_s"] == 0.0  # built once: the marker says so
    models = OnnxModels(built, ["CPUExecutionProvider"])
    wave = torch.sin(torch.arange(16000 * 3) * 0.05) * 0.3
    tokens = models.speech_tokens(wave)
    assert tokens.dtype == torch.int64 and tokens.numel() == 75  # 300 whisper frames -> 75 tokens (25 Hz)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 3**8
    emb = models.speaker_embedding(wave)
    assert emb.shape == (192,) and torch.isfinite(emb).all()


def test_the_exported_tokenizer_gives_the_torch_modules_tokens(built: Path) -> None:
    v2, v3 = rf._s3tokenizer()
    torch.manual_seed(0)  # build() seeds the same way before building the tokenizer
    tok = rf._Tokenizer(v3.S3TokenizerV3("v3", v3.ModelConfigV3(n_audio_layer=1)).eval()).eval()
    feats = torch.randn(1, 128, 523)
    length = torch.tensor([523], dtype=torch.int32)
    with torch.no_grad():
        want = tok(feats, length).numpy()
    sess = ort.InferenceSession(str(built / "speech_tokenizer_v3.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"feats": feats.numpy(), "feats_length": length.numpy()})[0]
    assert got.shape == want.shape == (1, 131)
    assert np.mean(got == want) > 0.98  # float rounding may move a value across an FSQ boundary


def test_measure_runs_distinct_prompts_through_the_frontend(built: Path) -> None:
    fig = rf.measure(built, prompts=2, seconds=3.0)
    assert fig["providers"] == ["CPUExecutionProvider"] and fig["prompts"] == 2
    assert fig["speech_tokens"] == 2 * 75
    assert fig["prompts_per_s"] == pytest.approx(2 / fig["wall_s"], rel=0.01)
