"""Flow stage-1 unit tests: state_dict conformance, building, noise, batch-vs-single equivalence."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cosyclone.base.device import DevicePolicy
from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT, build_flow, cosine_time_grid
from cosyclone.code2wav.noise import flow_noise
from cosyclone.model.config import DiTConfig, FlowConfig, ModelConfig
from tests.reference import state_dict_manifest

CPU = DevicePolicy(device=torch.device("cpu"), dtype=torch.float32, backend="cpu")
TINY = FlowConfig(vocab_size=40, pre_lookahead_channels=16,
                  dit=DiTConfig(dim=32, depth=2, heads=2, dim_head=16, ff_mult=2))


def test_state_dict_matches_released_flow_json() -> None:
    ref = {e["key"]: tuple(e["shape"]) for e in state_dict_manifest("flow")}
    with torch.device("meta"):
        model = CausalMaskedDiffWithDiT(FlowConfig())
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == ref
    buffers = {k for k, _ in model.named_buffers()}
    assert buffers == {"decoder.estimator.rotary_embed.inv_freq"}


def test_build_dummy_has_correct_inv_freq_and_no_file() -> None:
    model = build_flow(ModelConfig(flow=TINY), CPU, load_format="dummy")
    inv = model.decoder.estimator.rotary_embed.inv_freq
    j = torch.arange(8, dtype=torch.float32)
    assert inv.dtype == torch.float32
    torch.testing.assert_close(inv, 10000.0 ** (-2 * j / 16))
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in model.parameters())


def test_build_auto_loads_flow_pt(tmp_path: Path) -> None:
    src = build_flow(ModelConfig(flow=TINY), CPU, load_format="dummy")
    torch.save(src.state_dict(), tmp_path / "flow.pt")
    loaded = build_flow(ModelConfig(flow=TINY, model_dir=tmp_path), CPU, load_format="auto")
    for (k, a), (_, b) in zip(src.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_build_bf16_keeps_inv_freq_fp32() -> None:
    bf16 = replace(CPU, dtype=torch.bfloat16)
    model = build_flow(ModelConfig(flow=TINY), bf16, load_format="dummy")
    assert model.decoder.estimator.proj_out.weight.dtype == torch.bfloat16
    assert model.decoder.estimator.rotary_embed.inv_freq.dtype == torch.float32


def test_flow_noise_is_prefix_of_seeded_table() -> None:
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        full = torch.randn(1, 80, 15000)
    finally:
        torch.random.set_rng_state(state)
    assert torch.equal(flow_noise(37), full[:, :, :37])
    with pytest.raises(ValueError, match="15000"):
        flow_noise(15001)


def test_cosine_grid_endpoints() -> None:
    grid = cosine_time_grid(10, device=torch.device("cpu"))
    assert grid[0].item() == 0.0 and abs(grid[-1].item() - 1.0) < 1e-7 and torch.all(grid.diff() > 0)


def _row(gen: torch.Generator, n: int, p: int) -> dict[str, torch.Tensor]:
    return {"token": torch.randint(0, TINY.vocab_size, (n,), generator=gen),
            "prompt_token": torch.randint(0, TINY.vocab_size, (p,), generator=gen),
            "prompt_feat": torch.randn(2 * p, 80, generator=gen),
            "embedding": torch.randn(192, generator=gen)}


def _batch(rows: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    n_max = max(r["token"].numel() for r in rows)
    p_max = max(r["prompt_token"].numel() for r in rows)
    tok = torch.full((len(rows), n_max), 7, dtype=torch.long)  # junk padding must not matter
    pt = torch.full((len(rows), p_max), 3, dtype=torch.long)
    feat = torch.full((len(rows), 2 * p_max, 80), 5.0)
    for i, r in enumerate(rows):
        tok[i, : r["token"].numel()] = r["token"]
        pt[i, : r["prompt_token"].numel()] = r["prompt_token"]
        feat[i, : r["prompt_feat"].shape[0]] = r["prompt_feat"]
    return (tok, torch.tensor([r["token"].numel() for r in rows]), pt,
            torch.tensor([r["prompt_token"].numel() for r in rows]), feat,
            torch.stack([r["embedding"] for r in rows]))


def test_batch_equals_rows_alone() -> None:
    model = build_flow(ModelConfig(flow=TINY), CPU, load_format="dummy")
    gen = torch.Generator().manual_seed(1)
    rows = [_row(gen, n, p) for n, p in [(3, 40), (45, 2), (17, 17), (1, 0)]]
    mel, mel_len = model.inference(*_batch(rows), n_timesteps=3)
    assert mel.shape == (4, 80, 90) and mel_len.tolist() == [6, 90, 34, 2]
    for i, r in enumerate(rows):
        alone, alone_len = model.inference(*_batch([r]), n_timesteps=3)
        n2 = int(alone_len[0])
        torch.testing.assert_close(mel[i, :, :n2], alone[0], atol=1e-5, rtol=1e-5)
        assert mel[i, :, n2:].abs().max().item() == 0.0 if n2 < mel.shape[2] else True


def test_cpu_chunks_equal_one_batch() -> None:
    """token2wav's flow chunking (length-sorted, at most max_tokens padded positions a call) changes no
    row."""
    from cosyclone.code2wav.token2wav import run_flow

    model = build_flow(ModelConfig(flow=TINY), CPU, load_format="dummy")
    gen = torch.Generator().manual_seed(3)
    rows = [_row(gen, n, p) for n, p in [(30, 10), (2, 3), (12, 40), (5, 5), (1, 0)]]
    whole, whole_len = run_flow(model, *_batch(rows), n_timesteps=2, max_tokens=0)
    got, got_len = run_flow(model, *_batch(rows), n_timesteps=2, max_tokens=30)  # 40 and 52: alone
    assert torch.equal(got_len, whole_len) and got.shape == whole.shape == (5, 80, 60)
    torch.testing.assert_close(got, whole, atol=1e-5, rtol=1e-5)


def test_too_long_raises() -> None:
    model = build_flow(ModelConfig(flow=replace(TINY, cfm=replace(TINY.cfm, noise_frames=15000))), CPU,
                       load_format="dummy")
    gen = torch.Generator().manual_seed(2)
    with pytest.raises(ValueError, match="noise|frames"):
        model.inference(*_batch([_row(gen, 7400, 101)]), n_timesteps=1)
