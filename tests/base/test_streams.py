"""One code2wav stream and one capture stream per process: the same object on every call, never
the same device stream for the two roles, even when the stream pool wraps around."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from cosyclone.base.streams import ProcessStreams


@dataclass(frozen=True)
class FakeStream:
    """A stand-in for ``torch.cuda.Stream``: a fresh object wrapping one of the pool's handles."""

    cuda_stream: int


class RoundRobinPool:
    """torch's stream pool in miniature: each draw wraps the next of ``size`` handles, cycling."""

    def __init__(self, size: int) -> None:
        self.size, self.next, self.draws = size, 0, 0

    def __call__(self, device: torch.device) -> FakeStream:
        self.draws += 1
        handle = 100 + self.next % self.size
        self.next += 1
        return FakeStream(handle)


def test_each_role_gets_one_stream_per_process_and_the_roles_never_share_one() -> None:
    pool = RoundRobinPool(size=3)  # a ROCm-sized pool
    streams = ProcessStreams(make=pool, default=lambda device: 100)  # handle 100 is the default stream
    code2wav = streams.get("code2wav", "cuda:0")
    pool(torch.device("cuda:0"))  # someone else draws: the next draw would wrap onto code2wav's stream
    capture = streams.get("capture", "cuda:0")
    assert code2wav.cuda_stream != capture.cuda_stream
    assert 100 not in {code2wav.cuda_stream, capture.cuda_stream}  # neither is the default stream
    for _ in range(5):  # later runs and regraphs: the same objects, no new draw
        assert streams.get("code2wav", "cuda:0") is code2wav
        assert streams.get("capture", torch.device("cuda:0")) is capture
    draws = pool.draws
    streams.assert_distinct()
    assert pool.draws == draws


def test_a_pool_that_cannot_give_a_distinct_stream_is_an_error_not_a_shared_stream() -> None:
    streams = ProcessStreams(make=RoundRobinPool(size=1), default=lambda device: None)
    streams.get("code2wav", "cuda:0")
    with pytest.raises(RuntimeError, match="distinct"):
        streams.get("capture", "cuda:0")


def test_the_process_getters_hand_back_one_stream_each_and_never_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``code2wav_stream`` and ``capture_stream`` themselves, over this process's streams with the
    stand-in pool in place of ``torch.cuda.Stream`` (a CPU has none)."""
    from cosyclone.base import streams

    pool = RoundRobinPool(size=2)
    # this process's streams, made fresh over the stand-in pool (the getters read the module's)
    monkeypatch.setattr(streams, "PROCESS_STREAMS", ProcessStreams(make=pool, default=lambda device: None))
    c2w = streams.code2wav_stream("cuda")
    pool(torch.device("cuda"))  # a foreign draw: the pool wraps onto code2wav's handle next
    cap = streams.capture_stream("cuda")
    assert cap is not c2w and cap != c2w and cap.cuda_stream != c2w.cuda_stream
    for _ in range(3):
        assert streams.code2wav_stream("cuda") is c2w and streams.capture_stream("cuda") is cap
