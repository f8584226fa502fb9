"""token2wav composition: per-row speed change (official linear mel interpolation) and stage wiring."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from cosyclone.code2wav.token2wav import change_speed, speed_frames, token2wav
from cosyclone.model.config import FlowConfig


def test_speed_frames_matches_official_formula() -> None:
    assert [speed_frames(60, s) for s in (1.0, 1.25, 0.8, 4.0, 0.25)] == [60, 48, 75, 15, 240]
    assert speed_frames(1, 4.0) == 0


def test_change_speed_per_row_equals_single_row_interpolation() -> None:
    torch.manual_seed(0)
    lens, speeds = [20, 7, 13, 1], [1.25, 0.5, 1.0, 3.0]
    mel = torch.randn(4, 80, 20)
    out, out_len = change_speed(mel, torch.tensor(lens), speeds)
    assert out_len.tolist() == [16, 14, 13, 0] and out.shape == (4, 80, 16)
    for b, (n, s) in enumerate(zip(lens, speeds, strict=True)):
        m = int(out_len[b])
        if m:
            ref = (
                mel[b : b + 1, :, :n]
                if s == 1.0
                else F.interpolate(mel[b : b + 1, :, :n], size=m, mode="linear")
            )
            assert torch.equal(out[b, :, :m], ref[0])
        assert torch.all(out[b, :, m:] == 0)


def test_change_speed_all_ones_is_identity() -> None:
    mel, lens = torch.randn(2, 80, 5), torch.tensor([5, 3])
    out, out_len = change_speed(mel, lens, [1.0, 1.0])
    assert out is mel and out_len is lens
    with pytest.raises(ValueError):
        change_speed(mel, lens, [1.0])
    with pytest.raises(ValueError):
        change_speed(mel, lens, [1.0, 0.0])


class _Flow:
    """A flow stand-in (the :class:`MelFlow` protocol): each token becomes two frames of its value."""

    cfg = FlowConfig()

    def inference(self, token: Tensor, token_len: Tensor, prompt_token: Tensor, prompt_token_len: Tensor,
                  prompt_feat: Tensor, embedding: Tensor, *, n_timesteps: int | None = None,
                  pad_to: int = 0) -> tuple[Tensor, Tensor]:
        mel = token[:, None, :].float().repeat_interleave(2, dim=2).expand(-1, 80, -1).clone()
        return mel, 2 * token_len


class _Hift:
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def inference(self, mel: Tensor, mel_len: Tensor, *, max_frames: int | None = None,
                  bucket: int = 0) -> tuple[Tensor, Tensor]:
        self.seen.append(mel_len.tolist())
        return mel[:, 0].repeat_interleave(480, dim=1), 480 * mel_len


def test_token2wav_applies_each_rows_speed() -> None:
    hift = _Hift()
    tok = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]])
    res = token2wav(_Flow(), hift, tok, torch.tensor([5, 2]), tok[:, :1], torch.tensor([1, 1]),
                    torch.zeros(2, 2, 80), torch.zeros(2, 192), speed=[1.25, 0.5])
    assert hift.seen == [[8, 8]]
    assert [w.shape[0] for w in res.wavs] == [8 * 480, 8 * 480]
    assert all(w.dtype == torch.float32 for w in res.wavs)
    assert res.flow_seconds >= 0 and res.hift_seconds >= 0
    plain = token2wav(_Flow(), _Hift(), tok, torch.tensor([5, 2]), tok[:, :1], torch.tensor([1, 1]),
                      torch.zeros(2, 2, 80), torch.zeros(2, 192))
    assert [w.shape[0] for w in plain.wavs] == [10 * 480, 4 * 480]
