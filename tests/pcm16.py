"""Comparing a row's PCM16 WAVs from runs whose batches differ.

A row's audio from a batch of 4 equals the row run alone only up to float32 rounding: the flow's
matmuls and HiFT's convs pick kernels by batch size, which moves the float samples by ~3e-7
(measured on the tiny model; the mel by ~2e-6). PCM16 rounding turns that into 1-step flips of
the few samples lying near a rounding boundary (5 of 11520 in the seeds test), so the WAV bytes
differ while nothing is wrong. A wrong token moves most samples by hundreds of steps
(tests/engine/test_tiny_model_signal.py), so this check still fails on one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

#: Most PCM16 steps one sample may move between batch compositions (float32 rounding: ~0.01 steps,
#: so a flip is one step), and the most samples that may move.
MAX_STEPS = 1
MAX_MOVED_FRACTION = 0.01


def assert_same_pcm16_up_to_rounding(a: Path, b: Path) -> None:
    """``a`` and ``b`` are the same PCM16 WAV (format, length) up to batch-size float rounding."""
    info_a, info_b = sf.info(str(a)), sf.info(str(b))
    assert (info_a.samplerate, info_a.channels, info_a.subtype) == (
        info_b.samplerate,
        info_b.channels,
        info_b.subtype,
    ) and info_a.subtype == "PCM_16"
    x = sf.read(str(a), dtype="int16")[0].astype(np.int32)
    y = sf.read(str(b), dtype="int16")[0].astype(np.int32)
    assert x.shape == y.shape and x.size > 0, (x.shape, y.shape)
    moved = x != y
    steps = int(np.abs(x - y).max())
    assert steps <= MAX_STEPS and moved.mean() <= MAX_MOVED_FRACTION, (
        f"{a} vs {b}: {int(moved.sum())} of {x.size} samples differ, by up to {steps} PCM16 steps")
