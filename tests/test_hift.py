"""HiFT unit tests: released-size key conformance, loader forms, window, batching, noise tables."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from cosyclone.checkpoint import init_dummy
from cosyclone.code2wav.hift import CausalHiFTGenerator
from cosyclone.code2wav.noise import hift_rand_ini, hift_sine_waves
from cosyclone.config import HiFTConfig

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference" / "state_dicts"
SMALL = replace(HiFTConfig(), base_channels=8, f0_cond_channels=8)


def test_released_state_dict_on_meta() -> None:
    with torch.device("meta"):
        model = CausalHiFTGenerator(HiFTConfig())
    sd = {k: list(v.shape) for k, v in model.state_dict().items()}
    if (REF / "hift.json").is_file():
        ref = json.loads((REF / "hift.json").read_text())
        assert list(sd) == [e["key"] for e in ref]
        assert all(sd[e["key"]] == e["shape"] for e in ref)


def test_adapter_legacy_and_prefix() -> None:
    model = CausalHiFTGenerator(SMALL)
    init_dummy(model)
    legacy = {("generator." + k).replace("parametrizations.weight.original0", "weight_g")
              .replace("parametrizations.weight.original1", "weight_v"): v for k, v in model.state_dict().items()}
    assert CausalHiFTGenerator.adapt_keys(legacy).keys() == model.state_dict().keys()


def _dummy() -> CausalHiFTGenerator:
    model = CausalHiFTGenerator(SMALL)
    init_dummy(model)
    model.f0_predictor.double()
    model.fold_weight_norm().eval()
    model.noise_factory = hift_sine_waves
    return model


def test_window_follows_input_dtype() -> None:
    model = _dummy()
    assert "stft_window" not in model.state_dict()
    real, _ = model._stft(torch.randn(1, 64, dtype=torch.float64))
    assert real.dtype == torch.float64 and model.stft_window.dtype == torch.float64


def test_batch_rows_equal_alone() -> None:
    model = _dummy()
    mel = torch.randn(2, 80, 9)
    wav, lens = model.inference(mel, torch.tensor([9, 3]))
    a, _ = model.inference(mel[1:, :, :3], torch.tensor([3]))
    b, _ = model.inference(mel[:1], torch.tensor([9]))
    assert lens.tolist() == [4320, 1440]
    assert torch.equal(wav[1, :1440], a[0]) and torch.all(wav[1, 1440:] == 0)
    assert torch.equal(wav[0], b[0])


def test_noise_tables_released_values() -> None:
    assert torch.allclose(hift_rand_ini()[0, :4], torch.tensor([0.0, 0.17098892, 0.1653319, 0.14378005]))
    small = hift_sine_waves(100)
    assert torch.allclose(small.flatten()[:4], torch.tensor([0.922826, 0.4774475, 0.8270518, 0.28345716]))
    assert torch.equal(hift_sine_waves(5000)[:, :100], small)
