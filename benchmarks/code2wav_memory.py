"""Activation memory of one flow call and one HiFT call per padded position: the sizing constants.

Why: on an accelerator the code2wav budgets (``engine/sizing.py``: HiFT frames per call, flow
token positions per call) come from the memory free after load divided by these constants, so
they must be measured, and measured again on each new device. A call's peak minus what was
allocated before it, at several lengths and batch sizes; the constant is the least-squares slope
of bytes over padded positions (rows x the longest row), which is what the budgets bound.

Where it measures:

* CUDA/ROCm: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the
  bytes allocated before the call (what the caching allocator really handed out).
* CPU: the process's peak RSS (``VmHWM``, reset before each call through ``/proc/self/clear_refs``)
  minus the RSS before it, in a process whose glibc malloc serves every block above 128 KiB by
  ``mmap`` (``MALLOC_MMAP_THRESHOLD_``; the script re-executes itself with it), so a freed
  temporary leaves the RSS and the peak is the largest live set, not an allocator's high-water
  mark. HiFT runs with direct convolutions, as on a GPU (``build_hift(direct=True)``), and the
  flow's attention is SDPA's CPU path, which holds (heads x T x T) scores that flash attention on
  a GPU does not: the CPU slope of the flow is therefore an upper bound for a GPU.

Usage: ``python -m benchmarks.code2wav_memory [--device auto] [--flow-dtype fp32]`` (released
geometry, dummy weights; about 2 minutes on 2 CPU cores). Prints one JSON line per call and a
summary line with both slopes and their per-second-of-audio forms (HiFT 50 frames per second,
the flow 25 token positions per second).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

MMAP_THRESHOLD = "131072"
HIFT_POINTS = ((1, 250), (1, 500), (1, 1000), (2, 500))  # (rows, mel frames)
FLOW_POINTS = ((1, 100), (1, 200), (1, 400), (2, 200))  # (rows, target tokens); prompt 75 tokens each
PROMPT_TOKENS = 75


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_of(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes a call held at its peak beyond what was held before it (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - before)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the RSS now
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope through the origin's neighbourhood: bytes per padded position."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else my / max(1.0, mx)


def measure_hift(device: torch.device) -> list[tuple[int, int]]:
    from cosyclone.base.device import resolve
    from cosyclone.code2wav.hift import build_hift
    from cosyclone.model.config import released_config

    policy = resolve(device.type if device.type == "cpu" else "auto", "fp32")
    hift = build_hift(released_config(), policy, load_format="dummy", direct=True)
    gen = torch.Generator().manual_seed(0)
    out = []
    with torch.inference_mode():
        hift.inference(torch.randn(1, 80, 50, generator=gen).to(device), torch.tensor([50], device=device),
                       max_frames=0)  # warm-up
        for rows, frames in HIFT_POINTS:
            mel = torch.randn(rows, 80, frames, generator=gen).to(device)
            lens = torch.full((rows,), frames, device=device)
            t0 = time.perf_counter()
            got = peak_of(functools.partial(hift.inference, mel, lens, max_frames=0), device)
            print(json.dumps({"stage": "hift", "rows": rows, "frames": frames, "padded": rows * frames,
                              "peak_bytes": got, "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
            out.append((rows * frames, got))
    return out


def measure_flow(device: torch.device, dtype: str) -> list[tuple[int, int]]:
    from cosyclone.base.device import resolve
    from cosyclone.code2wav.flow import build_flow
    from cosyclone.model.config import released_config

    cfg = released_config()
    policy = resolve(device.type if device.type == "cpu" else "auto", dtype)
    flow = build_flow(cfg, policy, load_format="dummy")
    gen = torch.Generator().manual_seed(0)
    out = []

    def call(rows: int, tokens: int) -> None:
        flow.inference(torch.randint(0, cfg.flow.vocab_size, (rows, tokens), generator=gen).to(device),
                       torch.full((rows,), tokens, device=device),
                       torch.randint(0, cfg.flow.vocab_size, (rows, PROMPT_TOKENS), generator=gen).to(device),
                       torch.full((rows,), PROMPT_TOKENS, device=device),
                       torch.randn(rows, 2 * PROMPT_TOKENS, 80, generator=gen).to(device, policy.dtype),
                       torch.randn(rows, 192, generator=gen).to(device, policy.dtype), n_timesteps=1)

    with torch.inference_mode():
        call(1, 10)  # warm-up
        for rows, tokens in FLOW_POINTS:
            t0 = time.perf_counter()
            got = peak_of(functools.partial(call, rows, tokens), device)
            padded = rows * (tokens + PROMPT_TOKENS)
            print(
                json.dumps(
                    {
                        "stage": "flow",
                        "dtype": dtype,
                        "rows": rows,
                        "tokens": tokens + PROMPT_TOKENS,
                        "padded": padded,
                        "peak_bytes": got,
                        "seconds": round(time.perf_counter() - t0, 2),
                    }
                ),
                flush=True,
            )
            out.append((padded, got))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--flow-dtype", default="fp32", help="the flow's dtype (fp32 | bf16)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
        sys.exit(
            subprocess.call(
                [sys.executable, "-m", "benchmarks.code2wav_memory", *(argv or sys.argv[1:])], env=env
            )
        )
    torch.set_num_threads(args.threads)
    hift = slope(measure_hift(device))
    flow = slope(measure_flow(device, args.flow_dtype))
    print(json.dumps({"summary": True, "device": str(device), "hift_bytes_per_frame": round(hift),
                      "hift_bytes_per_audio_second": round(hift * 50), "flow_dtype": args.flow_dtype,
                      "flow_bytes_per_token": round(flow), "flow_bytes_per_audio_second": round(flow * 25),
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
