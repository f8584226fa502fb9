"""End to end on a tiny model dir: WAV file → ONNX + tokenizer → Requests → batch → handoff → back."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import soundfile as sf
import torch

from cosyclone.base import handoff
from cosyclone.engine.tiny import write_tiny_config
from cosyclone.errors import CosycloneError
from cosyclone.frontend import Frontend
from cosyclone.frontend.onnx import OnnxModels, get_session
from cosyclone.frontend.tiny_assets import write_tiny_onnx, write_tiny_tokenizer
from cosyclone.model.config import QWEN_DIR, load_model_config
from tests.request_batch import batch_requests, requests_from_batch, unbatch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_tiny_config(tmp_path_factory.mktemp("tiny"))
    write_tiny_tokenizer(root / QWEN_DIR)
    write_tiny_onnx(root)
    return root


def _wav(path: Path, sr: int, seconds: float) -> Path:
    t = torch.arange(int(sr * seconds), dtype=torch.float64) / sr
    x = 0.3 * torch.sin(2 * math.pi * 220 * t) * (1 + 0.5 * torch.sin(2 * math.pi * 3 * t))
    sf.write(str(path), torch.stack([x, 0.5 * x], 1).numpy(), sr)
    return path


def test_prepare_and_handoff(model_dir: Path, tmp_path: Path) -> None:
    fe = Frontend(load_model_config(model_dir))
    wav = _wav(tmp_path / "p.wav", 44100, 1.5)
    reqs = fe.prepare("row1", wav, "a prompt", "Hello there. The world is big.", seed=5)
    assert len(reqs) >= 1
    r = reqs[0]
    p = r.embed["speech_token"].numel()
    assert p > 0 and r.embed["speech_feat"].shape == (2 * p, 80)
    assert r.embed["embedding"].shape == (192,)
    assert 151646 in r.text_ids.tolist() and r.target_len < r.text_ids.numel()
    assert int(r.embed["speech_token"].max()) < 6561
    assert torch.equal(r.llm_prompt_tokens, r.embed["speech_token"])

    cl = fe.prepare("row2", (torch.randn(16000) * 0.1, 16000), None, "Bonjour.", mode="cross_lingual")
    assert cl[0].llm_prompt_tokens.numel() == 0 and cl[0].embed["speech_token"].numel() > 0
    ins = fe.prepare("row3", wav, None, "Hi there.", mode="instruct2", instruct="Speak softly.")
    assert ins[0].llm_prompt_tokens.numel() == 0

    batch = batch_requests(reqs + cl + ins)
    assert batch["embed"]["speech_feat"].shape[0] == len(reqs) + 2
    path = handoff.save(tmp_path / "b.handoff", batch)
    back = handoff.load(path)
    assert set(back["embed"]) == set(batch["embed"])
    rows = unbatch(back)
    assert [x["row_id"] for x in rows] == [x.row_id for x in reqs + cl + ins]
    rebuilt = requests_from_batch(back)
    for a, b in zip(reqs + cl + ins, rebuilt, strict=True):
        assert torch.equal(a.text_ids, b.text_ids) and a.target_len == b.target_len
        assert torch.equal(a.embed["speech_token"], b.embed["speech_token"])
        assert torch.equal(a.embed["speech_feat"], b.embed["speech_feat"])
        assert torch.equal(a.embed["embedding"], b.embed["embedding"])
        assert a.mode == b.mode and a.seed == b.seed


def test_sessions_cached_and_errors(model_dir: Path, tmp_path: Path) -> None:
    a, b = OnnxModels(model_dir), OnnxModels(model_dir)
    assert a._tok is b._tok and a._spk is b._spk
    assert get_session(model_dir / "campplus.onnx") is a._spk
    w = torch.randn(16000 * 2) * 0.1
    assert a.speech_tokens(w).shape == (math.ceil(200 / 4),)
    fe = Frontend(load_model_config(model_dir))
    low = tmp_path / "low.wav"
    sf.write(str(low), torch.zeros(8000).numpy(), 8000)
    with pytest.raises(CosycloneError, match="row 'bad'"):
        fe.prepare("bad", low, "x", "Hello.")
