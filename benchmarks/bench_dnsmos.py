"""Cost of eval's DNSMOS (cosyclone/eval/dnsmos.py) per second of audio, on this machine's CPU.

Usage: ``python -m benchmarks.bench_dnsmos [--clips 8] [--threads 0]``

Two kinds of clip, each scored as eval scores a batch (all windows in one pass): 3 s clips, which
DNSMOS doubles to one 9.01 s window each (the common length of a synthesized row, and its worst
cost per audio second), and 20 s clips (12 windows, one per second). Printed: seconds per clip,
per audio second, and the share of the P.835 model, the P.808 model and the mel; and the machine.
The audio is white noise at half scale: the models' cost does not depend on what they hear.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.machine import describe
from cosyclone.eval.dnsmos import SAMPLE_RATE, Dnsmos, p808_features, windows


def _time_parts(d: Dnsmos, clips: list[np.ndarray]) -> dict[str, float]:
    """Seconds of the whole score and of its parts (P.835 run, mel, P.808 run) over ``clips``."""
    t0 = time.perf_counter()
    d.score(clips)
    total = time.perf_counter() - t0
    stacked = np.concatenate([windows(c) for c in clips])
    t0 = time.perf_counter()
    d._p835.run(None, {"input_1": stacked})
    p835 = time.perf_counter() - t0
    t0 = time.perf_counter()
    feats = np.stack([p808_features(w) for w in stacked])
    mel = time.perf_counter() - t0
    t0 = time.perf_counter()
    d._p808.run(None, {"input_1": feats})
    p808 = time.perf_counter() - t0
    return {"total": total, "p835": p835, "mel": mel, "p808": p808, "windows": float(stacked.shape[0])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=8, help="clips of each length (8)")
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: the cores, at most 8)")
    args = ap.parse_args(argv)
    d = Dnsmos(threads=args.threads)
    rng = np.random.default_rng(0)
    d.score([rng.uniform(-0.5, 0.5, SAMPLE_RATE).astype(np.float32)])  # the sessions' first run
    print(f"DNSMOS on {describe()}, providers {d.providers}")
    for seconds in (3.0, 20.0):
        size = int(seconds * SAMPLE_RATE)
        clips = [rng.uniform(-0.5, 0.5, size).astype(np.float32) for _ in range(args.clips)]
        t = _time_parts(d, clips)
        audio = seconds * len(clips)
        print(f"  {len(clips)} clips of {seconds:g} s ({t['windows']:.0f} windows): {t['total']:.2f} s, "
              f"{t['total'] / len(clips):.3f} s per clip, {t['total'] / audio:.3f} s per audio second "
              f"(P.835 {t['p835']:.2f} s, mel {t['mel']:.2f} s, P.808 {t['p808']:.2f} s)")


if __name__ == "__main__":
    main()
