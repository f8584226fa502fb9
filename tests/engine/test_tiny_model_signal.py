"""The tiny model's audio follows its speech tokens, so byte-identity tests on it can fail.

Batch invariance, seeds, resume and rerun tests compare WAV bytes on `cosyclone make-tiny-model`
directories to catch wrong tokens. That only works if different tokens give different PCM16
audio: with the dummy init's 0.02 scale in the flow and HiFT every wav was the same ~5e-3 peak
waveform whatever the tokens (float samples moved by ~1e-10, PCM16 bytes not at all).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

from cosyclone.base.device import DevicePolicy
from cosyclone.cli import app
from cosyclone.code2wav.flow import build_flow
from cosyclone.code2wav.hift import build_hift
from cosyclone.code2wav.token2wav import token2wav
from cosyclone.folder.layout import wav_path
from cosyclone.model.config import load_model_config
from tests.pcm16 import assert_same_pcm16_up_to_rounding
from tests.run_folders import ROOT, diags

CPU = DevicePolicy(torch.device("cpu"), torch.float32, "cpu")
ROW = {"id": "r", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words",
       "text": "hello world, once more"}


def _synth(manifest: Path, model_dir: Path, out: Path, seed: int) -> tuple[dict, np.ndarray, bytes]:
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out),
                                   "--device", "cpu", "--max-tokens", "6", "--n-timesteps", "2",
                                   "--seed", str(seed)])
    assert res.exit_code == 0, res.output
    wav = wav_path(out, "r")
    assert sf.info(str(wav)).subtype == "PCM_16"
    data, _ = sf.read(str(wav), dtype="int16")
    return diags(out)["r"], data.astype(np.float64) / 32768.0, wav.read_bytes()


def test_two_seeds_give_different_pcm16_wavs(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(ROW) + "\n")
    d1, a, bytes1 = _synth(manifest, tiny_model_dir, tmp_path / "s1", 1)
    d2, b, bytes2 = _synth(manifest, tiny_model_dir, tmp_path / "s2", 2)
    # same lengths and row seeds that differ: the seed only picks which tokens the sampler draws
    # (the flow's and HiFT's noise are fixed tables), so the wavs can differ only through the tokens
    assert d1["tokens"] == d2["tokens"] == [6] and d1["seed"] != d2["seed"]
    for x in (a, b):
        assert np.isfinite(x).all() and 0.05 <= np.abs(x).max() <= 0.5  # audible, far from the clamp
    assert bytes1 != bytes2
    assert a.shape == b.shape and np.mean(a != b) > 0.5  # most samples move, not a stray LSB
    assert np.abs(a - b).max() > 0.01
    with pytest.raises(AssertionError):  # so the batch-rounding tolerance of other tests sees it too
        assert_same_pcm16_up_to_rounding(wav_path(tmp_path / "s1", "r"), wav_path(tmp_path / "s2", "r"))


def test_one_changed_token_or_speaker_changes_the_pcm16_audio(tiny_model_dir: Path) -> None:
    """What the byte-identity tests need: a single wrong token (first, middle or last) shows up, and so
    does another speaker embedding (tests that compare two commands' rows rely on it)."""
    cfg = load_model_config(tiny_model_dir)
    flow, hift = build_flow(cfg, CPU), build_hift(cfg, CPU)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 6561, (1, 8), generator=gen)
    feat = torch.randn(1, 16, 80, generator=gen) - 6.0  # log-mel-like prompt features
    emb = torch.randn(1, 192, generator=gen)
    base = torch.randint(0, 6561, (1, 6), generator=gen)

    def pcm16(tokens: torch.Tensor, speaker: torch.Tensor = emb) -> np.ndarray:
        res = token2wav(flow, hift, tokens, torch.tensor([6]), prompt, torch.tensor([8]), feat, speaker,
                        n_timesteps=2)
        wav = res.wavs[0].numpy()
        assert np.isfinite(wav).all()
        return np.round(np.clip(wav, -1, 1) * 32767).astype(np.int16)

    ref = pcm16(base)
    assert np.array_equal(pcm16(base.clone()), ref)  # deterministic: equal tokens, equal bytes
    for pos in (0, 3, 5):
        other = base.clone()
        other[0, pos] = (other[0, pos] + 1000) % 6561
        assert not np.array_equal(pcm16(other), ref), pos
    assert not np.array_equal(pcm16(base, torch.randn(1, 192, generator=gen)), ref)  # the speaker counts too
