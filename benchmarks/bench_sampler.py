"""Sampler cost per decode step (batch 16, V = 6761), to print next to the talker's step cost.

It times the per-call reference sampler (``BatchSampler``, tests/samplers.py, race draw only: the
LEGACY multinomial draw exists in the product's in-step sampler alone); the product's sampler
runs inside the decode step, where bench_engine counts its cost.

Usage: ``python benchmarks/bench_sampler.py [--batch 16] [--vocab 6761] [--steps 200] [--device cpu]``.
``main()`` returns the mean seconds per ``sample()`` call so the talker bench can import it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from cosyclone.talker.sampler import SamplerOptions


def _test_samplers():
    """tests/samplers.py (the samplers live outside the product), importable however this bench runs."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests import samplers

    return samplers


def bench(batch: int = 16, vocab: int = 6761, steps: int = 200, device: str = "cpu",
          warmup: int = 10) -> float:
    """Mean wall seconds per sample() call (device-synchronised at the end only)."""
    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.log_softmax(torch.randn(batch, vocab, generator=g) * 3, dim=-1).to(dev)
    sampler = _test_samplers().BatchSampler(SamplerOptions(), row_ids=[f"r{i}" for i in range(batch)],
                                            row_seeds=list(range(batch)), min_len=[steps // 4] * batch,
                                            speech_token_size=6561, device=dev)
    rows = torch.arange(batch, device=dev)
    for k in range(warmup):
        sampler.sample(logits, rows, k)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(warmup, warmup + steps):
        sampler.sample(logits, rows, k)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=6761)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    sec = bench(a.batch, a.vocab, a.steps, a.device)
    print(f"sampler: {sec * 1e3:.3f} ms/step at batch {a.batch}, V={a.vocab}, device={a.device}")
    return sec


if __name__ == "__main__":
    main()
