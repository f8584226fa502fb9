"""HiFT unit tests: released-size key conformance, loader forms, window, batching, noise tables."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import replace

import torch
from typing_extensions import override

from cosyclone.base.batching import chunks_by_length
from cosyclone.code2wav.hift import CausalHiFTGenerator
from cosyclone.code2wav.noise import flow_noise_table, hift_generator_before_rand_ini, hift_sine_waves
from cosyclone.model.checkpoint import init_dummy
from cosyclone.model.config import HiFTConfig
from tests.reference import state_dict_manifest, state_dict_summary

SMALL = replace(HiFTConfig(), base_channels=8, f0_cond_channels=8)

# SHA-256 of the float32 bytes (C order) of the released construction-time tables, as VECTORS.md
# and state_dicts/summary.json give them. No checkpoint holds these tables: the digests are the
# only proof that the private-generator replay in noise.py draws the released values.
RELEASED_TABLE_SHA256 = {
    "hift.m_source.l_sin_gen.sine_waves": "2f60f92217f65e9f2728d4e662f520432603d88e7a24f78666cc88bb76247f61",
    "hift.m_source.l_sin_gen.rand_ini": "7dd3ebf888575a2514d2ae7a19adadd351540458ca331fc9518a361f0dee9d01",
    "hift.stft_window": "d7ffe209e353d8cece11bc1f02f63a66f1721dafd2069aedc048b3b419995069",
    "flow.decoder.rand_noise": "584a26e6eaad944407a96c5999aaa5cd0a6a359309a841eade68bf805c072322",
}
SINE_WAVES_SAMPLES = 7_200_000  # the released table is (1, 7200000, 9): 300 s at 24 kHz


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _rand_ini() -> torch.Tensor:
    """The released ``rand_ini`` (1, 9) with harmonic 0 set to 0, as the module holds it. The vocoder
    never reads it (the causal source does not), but drawing it proves the replay's order."""
    out = torch.rand(1, 9, generator=hift_generator_before_rand_ini())
    out[:, 0] = 0
    return out


def test_released_state_dict_on_meta() -> None:
    with torch.device("meta"):
        model = CausalHiFTGenerator(HiFTConfig())
    sd = {k: list(v.shape) for k, v in model.state_dict().items()}
    ref = state_dict_manifest("hift")
    assert list(sd) == [e["key"] for e in ref]
    assert all(sd[e["key"]] == e["shape"] for e in ref)


def test_noise_tables_have_the_released_sha256() -> None:
    """The full 7.2M x 9 sine-noise table, rand_ini, the STFT window and the CFM noise, bit for bit."""
    full = hift_sine_waves(SINE_WAVES_SAMPLES)
    assert full.shape == (1, SINE_WAVES_SAMPLES, 9) and full.dtype == torch.float32
    got = {"hift.m_source.l_sin_gen.sine_waves": _sha256(full),
           "hift.m_source.l_sin_gen.rand_ini": _sha256(_rand_ini()),
           "hift.stft_window": _sha256(CausalHiFTGenerator(SMALL).stft_window),
           "flow.decoder.rand_noise": _sha256(flow_noise_table())}
    assert got == RELEASED_TABLE_SHA256
    # what the vocoder draws on demand is an exact prefix of that table
    assert torch.equal(hift_sine_waves(4800), full[:, :4800])


def test_pinned_digests_are_the_reference_summary() -> None:
    """The constants above are the ones the reference capture recorded (state_dicts/summary.json)."""
    tables = state_dict_summary()["construction_time_tables_not_in_any_checkpoint"]
    for name, digest in RELEASED_TABLE_SHA256.items():
        assert tables[name]["sha256_of_float32_bytes"] == digest, name
    assert tables["hift.m_source.l_sin_gen.sine_waves"]["shape"] == [1, SINE_WAVES_SAMPLES, 9]


def test_adapter_legacy_and_prefix() -> None:
    model = CausalHiFTGenerator(SMALL)
    init_dummy(model)
    legacy = {
        ("generator." + k)
        .replace("parametrizations.weight.original0", "weight_g")
        .replace("parametrizations.weight.original1", "weight_v"): v
        for k, v in model.state_dict().items()
    }
    assert CausalHiFTGenerator.adapt_keys(legacy).keys() == model.state_dict().keys()


def _dummy(std: float = 0.02, cls: type[CausalHiFTGenerator] = CausalHiFTGenerator) -> CausalHiFTGenerator:
    """Tiny HiFT (a ``cls``) with seeded weights; a larger ``std`` makes the source branch loud enough
    that a wrong STFT/iSTFT edge at a row's end shows (~1e-3) far above float rounding (~1e-7)."""
    model = cls(SMALL)
    init_dummy(model, std=std)
    model.f0_predictor.double()
    model.fold_weight_norm().eval()
    model.noise_factory = hift_sine_waves
    return model


def test_window_follows_input_dtype() -> None:
    model = _dummy()
    assert "stft_window" not in model.state_dict()
    spec = model.source_stft(torch.randn(1, 1, 64, dtype=torch.float64))
    assert spec.dtype == torch.float64 and model.stft_window.dtype == torch.float64


def test_batch_rows_equal_alone() -> None:
    """Rows of very different lengths share one padded batch and each equals the row run alone."""
    model = _dummy(std=0.3)
    lens = [3, 11, 20]
    torch.manual_seed(0)
    mel = torch.randn(len(lens), 80, 20)
    wav, wav_len = model.inference(mel, torch.tensor(lens), max_frames=0)  # 0: one padded batch
    assert wav.shape == (3, 20 * 480) and wav_len.tolist() == [n * 480 for n in lens]
    for b, n in enumerate(lens):
        alone, alone_len = model.inference(mel[b : b + 1, :, :n], torch.tensor([n]))
        assert int(alone_len[0]) == n * 480
        assert (wav[b, : n * 480] - alone[0]).abs().max().item() < 1e-6, (b, n)
        assert torch.all(wav[b, n * 480 :] == 0)
        assert alone[0].abs().max().item() > 1e-2  # loud enough for 1e-6 to be a strict bound


def test_row_chunks_equal_one_padded_batch() -> None:
    """CPU chunking (rows sorted by length, at most max_frames padded frames a call) changes nothing."""
    model = _dummy(std=0.3)
    lens = torch.tensor([20, 3, 11, 5, 0, 9])
    torch.manual_seed(2)
    mel = torch.randn(len(lens), 80, 20)
    whole, whole_len = model.inference(mel, lens, max_frames=0)
    chunks = chunks_by_length(lens.tolist(), 24)
    assert sorted(i for c in chunks for i in c) == list(range(len(lens))) and len(chunks) > 2
    assert all(len(c) * max(1, max(int(lens[i]) for i in c)) <= 24 or len(c) == 1 for c in chunks)
    got, got_len = model.inference(mel, lens, max_frames=24)
    assert torch.equal(got_len, whole_len) and got.shape == whole.shape
    assert (got - whole).abs().max().item() < 1e-6
    assert torch.all(got[4] == 0)


def test_rows_side_by_side_on_cpu_threads_equal_one_padded_batch() -> None:
    """On CPU with two threads, chunks run on two worker threads (one intra-op thread each): each
    row is what one padded batch gives, the noise table is grown once before them, the caller
    keeps its own thread count, one thread gives the same bytes, and no worker outlives the call
    (a live thread would stop the text pool from forking)."""
    ran: list[tuple[str, int]] = []

    class SpyHiFT(CausalHiFTGenerator):
        """Notes the thread (and its torch thread count) of each chunk's batch."""

        @override
        def padded_batch(self, mel: torch.Tensor, mel_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            ran.append((threading.current_thread().name, torch.get_num_threads()))
            return super().padded_batch(mel, mel_len)

    model = _dummy(std=0.3, cls=SpyHiFT)
    model.sine_waves = model.sine_waves[:, :0]  # the workers need more noise than the model holds
    lens = torch.tensor([20, 3, 11, 5, 9, 14])
    torch.manual_seed(3)
    mel = torch.randn(len(lens), 80, 20)
    whole, _ = model.inference(mel, lens, max_frames=0)
    ran.clear()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got, _ = model.inference(mel, lens, max_frames=24)  # several chunks
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        serial, _ = model.inference(mel, lens, max_frames=24)  # one thread: the chunks in turn, here
    finally:
        torch.set_num_threads(before)
    side = [r for r in ran if r[0].startswith("cosyclone-hift")]
    assert len(side) >= 2 and all(n == 1 for _, n in side) and len(ran) == 2 * len(side), ran
    assert (got - whole).abs().max().item() < 1e-6
    assert torch.equal(got, serial)  # the chunks come from the rows, not from the thread count
    # none outlives the call
    assert not [t for t in threading.enumerate() if t.name.startswith("cosyclone-hift")]


def test_padding_garbage_does_not_matter() -> None:
    """Huge values, inf and NaN past a row's end change nothing (the look-ahead convs see zeros)."""
    model = _dummy(std=0.3)
    lens = torch.tensor([20, 3, 11, 0])
    torch.manual_seed(1)
    mel = torch.randn(4, 80, 20)
    clean = mel.clone()
    for b, n in enumerate(lens.tolist()):
        clean[b, :, n:] = 0
        mel[b, :, n:] = torch.randn(80, 20 - n) * 1e4
    mel[1, 5, 7], mel[2, 0, 15] = float("nan"), float("inf")
    got, got_len = model.inference(mel, lens)
    ref, _ = model.inference(clean, lens)
    assert torch.isfinite(got).all() and got_len.tolist() == [9600, 1440, 5280, 0]
    assert torch.equal(got, ref)
    assert torch.all(got[3] == 0)


def test_frame_arithmetic() -> None:
    """480·n samples -> 120·n+1 centred STFT frames, as many as the decoder's upsampling reaches
    (120·n frames + 1 reflect-padded) -> iSTFT back to 480·n samples (checked, not assumed)."""
    model = _dummy()
    with torch.inference_mode():
        for n in (1, 3, 7):
            assert model.source_stft(torch.randn(1, 1, n * 480)).shape[-1] == 120 * n + 1
            decoded = model.network(torch.randn(1, 80, n), torch.randn(1, 18, 120 * n + 1))
            assert decoded.shape[-1] == 120 * n + 1
            assert model.to_wave(torch.randn(1, 18, 120 * n + 1)).shape[-1] == n * 480


def test_noise_tables_released_values() -> None:
    assert torch.allclose(_rand_ini()[0, :4], torch.tensor([0.0, 0.17098892, 0.1653319, 0.14378005]))
    small = hift_sine_waves(100)
    assert torch.allclose(small.flatten()[:4], torch.tensor([0.922826, 0.4774475, 0.8270518, 0.28345716]))
    assert torch.equal(hift_sine_waves(5000)[:, :100], small)
