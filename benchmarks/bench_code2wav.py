"""Stage-1 (flow) and stage-2 (HiFT) real-time factor on full-size dummy weights.

Workload as in BASELINE_CPU.md: 100 target tokens (4.0 s of audio), a 75-token prompt with a
(150, 80) prompt mel, 10 Euler steps. RTF = compute seconds / audio seconds, per row; batch 8
reports per-row RTF (wall / 8 / 4 s) so it compares directly with batch 1. The official numbers
(CPU, 2 threads, fp32, batch 1) are printed alongside: flow 3.31, HiFT 0.19.

Usage: ``python -m benchmarks.bench_code2wav [--batches 1 8] [--steps 10] [--dtype fp32|bf16]``.
``--steps`` below 10 times fewer Euler steps and scales the flow time by 10/steps (each step costs
the same), to keep a CPU run short; the output says when it did so.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from cosyclone.code2wav.flow import build_flow
from cosyclone.config import released_config
from cosyclone.device import resolve

OFFICIAL_FLOW_RTF = 3.31
OFFICIAL_HIFT_RTF = 0.19
TOKENS, PROMPT_TOKENS, AUDIO_S = 100, 75, 4.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1, help="timed runs per batch (best is kept), after a warm-up")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    ap.add_argument("--no-hift", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = resolve(args.device, args.dtype)
    cfg = released_config()
    t0 = time.perf_counter()
    flow = build_flow(cfg, policy, load_format="dummy")
    print(f"flow built in {time.perf_counter() - t0:.1f} s on {policy.device} ({policy.dtype}), "
          f"threads={torch.get_num_threads()}")
    hift = None
    if not args.no_hift:
        try:
            from cosyclone.code2wav.hift import build_hift

            hift = build_hift(cfg, policy, load_format="dummy")
        except Exception as exc:  # the HiFT module may be unfinished; flow numbers still count
            print(f"HiFT skipped: {type(exc).__name__}: {exc}")
    dev = policy.device
    gen = torch.Generator().manual_seed(0)
    scale = 10 / args.steps
    note = f" (timed {args.steps} steps, x{scale:g})" if args.steps != 10 else ""
    for b in args.batches:
        token = torch.randint(0, cfg.flow.vocab_size, (b, TOKENS), generator=gen).to(dev)
        prompt = torch.randint(0, cfg.flow.vocab_size, (b, PROMPT_TOKENS), generator=gen).to(dev)
        feat = torch.randn(b, 2 * PROMPT_TOKENS, 80, generator=gen).to(dev)
        emb = torch.randn(b, 192, generator=gen).to(dev)
        lens = torch.full((b,), TOKENS, device=dev)
        plens = torch.full((b,), PROMPT_TOKENS, device=dev)
        out: dict[str, torch.Tensor] = {}

        def run_flow(token=token, prompt=prompt, feat=feat, emb=emb, lens=lens, plens=plens, out=out) -> None:
            out["mel"], out["len"] = flow.inference(token, lens, prompt, plens, feat, emb, n_timesteps=args.steps)

        flow.inference(token[:, :4], lens.clamp(max=4), prompt[:, :4], plens.clamp(max=4), feat[:, :8], emb,
                       n_timesteps=1)  # warm-up (allocator, kernels)
        flow_s = _time(run_flow, dev, args.reps) * scale
        line = (f"batch {b}: flow {flow_s:.2f} s -> RTF/row {flow_s / b / AUDIO_S:.3f}{note} "
                f"[official {OFFICIAL_FLOW_RTF}]")
        if hift is not None:
            mel = out["mel"]
            mel_len = out["len"]
            with torch.inference_mode():
                hift.inference(mel, mel_len)  # warm-up
                hift_s = _time(lambda mel=mel, mel_len=mel_len: hift.inference(mel, mel_len), dev, args.reps)
            line += f"; HiFT {hift_s:.2f} s -> RTF/row {hift_s / b / AUDIO_S:.3f} [official {OFFICIAL_HIFT_RTF}]"
        print(line, flush=True)


if __name__ == "__main__":
    main()
