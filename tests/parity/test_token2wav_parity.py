"""token2wav parity (vectors/token2wav): flow -> speed change -> HiFT through the pipeline's own path.

The official ``CosyVoice3Model.token2wav`` (non-streaming, token_offset 0, finalize) was captured at
two speeds. We run :func:`cosyclone.code2wav.token2wav.token2wav`, the function the pipeline's
code2wav stage calls, on the reduced flow and HiFT with the stored weights; the flow starts from
its own rebuilt CFM noise (checked equal to the captured slice) and HiFT gets the stored noise
tables. File names, input names and output names come from the vectors' JSON.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from cosyclone.code2wav.noise import flow_noise
from cosyclone.code2wav.token2wav import token2wav

from .conftest import VECTORS, load_vector_set
from .models import small_flow, small_hift

ATOL = 1e-5  # VECTORS.md's suggested waveform tolerance; measured: 7.2e-7 (speed 1.0), 8.5e-7 (1.25)
FLOW_INPUTS = ("token", "prompt_token", "prompt_feat", "embedding")  # flow.inference's argument order


def _weights(meta: dict[str, Any], component: str) -> Any:
    """The entry of the JSON's ``weights`` list that lives under ``<component>/``."""
    (name,) = [w for w in meta["weights"] if w.split("/")[0] == component]
    return VECTORS / name


def _vocoder_set(meta: dict[str, Any], flow_set: str) -> str:
    """The vector set of the other weights file (the vocoder's; its folder also holds its noise tables)."""
    (name,) = [w.split("/")[0] for w in meta["weights"] if w.split("/")[0] != flow_set]
    return name


def _speed(output_name: str) -> float:
    match = re.fullmatch(r"speed([0-9.]+)\.speech", output_name)
    assert match, output_name
    return float(match.group(1))


@pytest.fixture(scope="module")
def t2w() -> dict[str, Any]:
    meta, outputs = load_vector_set("token2wav")
    source, names = meta["inputs"].split(":", 1)
    component = source.strip().split("/")[0]
    wanted = [n.strip() for n in names.split(",")]
    assert [n.split(".", 1)[1] for n in wanted] == list(FLOW_INPUTS), wanted
    flow_meta, flow_vec = load_vector_set(component)
    vocoder = _vocoder_set(meta, component)
    hift_meta, hift_vec = load_vector_set(vocoder)
    flow = small_flow(flow_meta, _weights(meta, component))
    hift = small_hift(hift_meta, _weights(meta, vocoder))
    hift.set_noise_tables(hift_vec["tables.sine_waves_slice"])
    return {
        "meta": meta,
        "outputs": outputs,
        "inputs": [flow_vec[n] for n in wanted],
        "flow": flow,
        "hift": hift,
        "noise": flow_vec["inputs.rand_noise_slice"],
    }


def _run(t2w: dict[str, Any], speeds: list[float]) -> list[torch.Tensor]:
    """The captured row repeated once per speed, as one batch."""
    tok, ptok, pfeat, emb = t2w["inputs"]
    b = len(speeds)
    return token2wav(t2w["flow"], t2w["hift"], tok.expand(b, -1), torch.tensor([tok.shape[1]] * b),
                     ptok.expand(b, -1), torch.tensor([ptok.shape[1]] * b), pfeat.expand(b, -1, -1),
                     emb.expand(b, -1), speed=speeds).wavs


def test_flow_noise_is_the_captured_slice(t2w: dict[str, Any]) -> None:
    """token2wav lets the flow draw its own noise; it must be the slice the official call used."""
    tok, ptok, _, _ = t2w["inputs"]
    frames = t2w["noise"].shape[2]
    assert frames == t2w["flow"].cfg.token_mel_ratio * (tok.shape[1] + ptok.shape[1])
    assert torch.equal(flow_noise(frames), t2w["noise"])
    assert t2w["flow"].cfg.cfm.n_timesteps == 10  # the official inference hard-codes 10 steps


def test_token2wav_each_speed(t2w: dict[str, Any]) -> None:
    for name in t2w["meta"]["outputs"]:
        ref = t2w["outputs"][name]
        (wav,) = _run(t2w, [_speed(name)])
        assert wav.dtype == torch.float32 and wav.shape == ref.shape[1:], (name, wav.shape, ref.shape)
        err = (wav - ref[0]).abs().max().item()
        print(f"{name}: max abs error {err:.3e}")
        assert err < ATOL, (name, err)


def test_token2wav_speeds_in_one_batch(t2w: dict[str, Any]) -> None:
    """Rows with different speeds (hence different mel lengths) in one batch keep their reference output."""
    names = list(t2w["meta"]["outputs"])
    wavs = _run(t2w, [_speed(n) for n in names])
    for name, wav in zip(names, wavs, strict=True):
        ref = t2w["outputs"][name][0]
        assert wav.shape == ref.shape, (name, wav.shape, ref.shape)
        assert (wav - ref).abs().max().item() < ATOL, name
