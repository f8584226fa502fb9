"""Stage-1 (flow) and stage-2 (HiFT) real-time factor on full-size dummy weights.

Workload as in BASELINE_CPU.md: 100 target tokens (4.0 s of audio), a 75-token prompt with a
(150, 80) prompt mel, 10 Euler steps. RTF = compute seconds / audio seconds, per row; batch 8
reports per-row RTF (wall / 8 / 4 s) so it compares directly with batch 1. The official numbers
(CPU, 2 threads, fp32, batch 1) are printed alongside: flow 3.31, HiFT 0.19.

HiFT is timed on its own released-size input, a (B, 80, 200) mel (4.0 s of audio per row, as in
the baseline), fp32 (its F0 predictor in float64), median of ``--hift-reps`` runs after
``--hift-warmup`` untimed rounds (glibc's malloc takes several calls to stop mapping and faulting
in fresh pages for the large temporaries; a long run is past that), per row at each batch size;
the ratio is against the official 0.76 s per request, which was measured on another machine (a
2-core Intel Xeon with AMX) in another run, so it is indicative only: the honest ratio comes from
runs alternated in one window on one machine.

Usage: ``python -m benchmarks.bench_code2wav [--batches 1 8] [--steps 10] [--dtypes fp32 bf16]
[--hift-only]``. ``--steps`` below 10 times fewer Euler steps and scales the flow time by 10/steps
(each step costs the same), to keep a CPU run short; the output says when it did so.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from benchmarks.machine import cpu_name
from cosyclone.base.device import resolve
from cosyclone.code2wav.flow import build_flow
from cosyclone.model.config import ModelConfig, released_config

OFFICIAL_FLOW_RTF = 3.31
OFFICIAL_HIFT_RTF = 0.19
OFFICIAL_HIFT_S = 0.76  # per 4 s request, BASELINE_CPU.md (2-core Intel Xeon with AMX, another run)
HIFT_MEL_FRAMES = 200  # 4.0 s at 50 Hz, the baseline's HiFT input
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


def _inputs(cfg, b: int, dev: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(b)
    return {
        "token": torch.randint(0, cfg.flow.vocab_size, (b, TOKENS), generator=gen).to(dev),
        "prompt": torch.randint(0, cfg.flow.vocab_size, (b, PROMPT_TOKENS), generator=gen).to(dev),
        "feat": torch.randn(b, 2 * PROMPT_TOKENS, 80, generator=gen).to(dev),
        "emb": torch.randn(b, 192, generator=gen).to(dev),
        "lens": torch.full((b,), TOKENS, device=dev),
        "plens": torch.full((b,), PROMPT_TOKENS, device=dev),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument(
        "--reps", type=int, default=1, help="timed runs per batch (best is kept), after a warm-up"
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], help="flow dtypes to time, in order")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (0 = leave as is)")
    ap.add_argument("--no-hift", action="store_true")
    ap.add_argument("--hift-only", action="store_true", help="time only HiFT (no flow)")
    ap.add_argument(
        "--hift-reps", type=int, default=3, help="timed HiFT runs per batch (median), after a warm-up"
    )
    ap.add_argument(
        "--hift-warmup",
        type=int,
        default=3,
        help="untimed alternated HiFT rounds per batch before timing, at least 1 (malloc's steady state)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = released_config()
    if args.hift_only:
        bench_hift(cfg, args.device, args.batches, args.hift_reps, warmup=args.hift_warmup)
        return
    scale = 10 / args.steps
    note = f" (timed {args.steps} steps, x{scale:g})" if args.steps != 10 else ""
    results: dict[tuple[str, int], float] = {}
    mels: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for name in args.dtypes:
        policy = resolve(args.device, name)
        dev = policy.device
        t0 = time.perf_counter()
        flow = build_flow(cfg, policy, load_format="dummy")
        print(
            f"flow built in {time.perf_counter() - t0:.1f} s on "
            f"{cpu_name() if dev.type == 'cpu' else dev} ({policy.dtype}), "
            f"threads={torch.get_num_threads()}",
            flush=True,
        )
        for b in args.batches:
            x = _inputs(cfg, b, dev)
            out: dict[str, torch.Tensor] = {}

            def run_flow(x=x, out=out, flow=flow) -> None:
                out["mel"], out["len"] = flow.inference(
                    x["token"],
                    x["lens"],
                    x["prompt"],
                    x["plens"],
                    x["feat"],
                    x["emb"],
                    n_timesteps=args.steps,
                )

            flow.inference(
                x["token"][:, :4],
                x["lens"].clamp(max=4),
                x["prompt"][:, :4],
                x["plens"].clamp(max=4),
                x["feat"][:, :8],
                x["emb"],
                n_timesteps=1,
            )  # warm-up (allocator, kernels)
            flow_s = _time(run_flow, dev, args.reps) * scale
            results[(name, b)] = flow_s
            mels[(name, b)] = (out["mel"], out["len"])
            base = results.get((args.dtypes[0], 1))
            gain = f"; per-row throughput {base * b / flow_s:.2f}x {args.dtypes[0]} batch 1" if base else ""
            print(
                f"flow {name} batch {b}: {flow_s:.2f} s -> RTF/row {flow_s / b / AUDIO_S:.3f}{note} "
                f"[official {OFFICIAL_FLOW_RTF}: {OFFICIAL_FLOW_RTF * AUDIO_S * b / flow_s:.2f}x its per-row "
                f"throughput; baseline measured in another run (Intel Xeon with AMX), not alternated]{gain}",
                flush=True,
            )
        del flow, run_flow
    ref = args.dtypes[0]
    for (name, b), (mel, _) in mels.items():
        if name != ref and (ref, b) in mels:
            diff = (mel - mels[(ref, b)][0]).abs()
            print(f"flow {name} vs {ref} mel, batch {b} (same dummy weights and inputs): max |diff| "
                  f"{diff.max().item():.3g}, mean {diff.mean().item():.3g} (mel values within "
                  f"+-{mels[(ref, b)][0].abs().max().item():.3g})")
    if not args.no_hift:
        bench_hift(cfg, args.device, args.batches, args.hift_reps, warmup=args.hift_warmup)


def bench_hift(
    cfg: ModelConfig, device: str, batches: list[int], reps: int, *, warmup: int = 3
) -> dict[int, float]:
    """HiFT seconds per row at each batch size on (B, 80, 200) mels, as built for the device (on CPU
    its long residual convs run as FFT convs) and, alternated with it in the same window, with every
    conv direct (the algorithm before the FFT convs): their ratio is measured in this run. With
    ``COSYCLONE_BENCH_OFFICIAL`` naming a CosyVoice checkout, the official vocoder runs in the same
    window too, on the same weights (:mod:`benchmarks.official_hift`), and the ratio against it is
    this run's; without it the ratio is against the official per-request figure measured on another
    machine (indicative only). ``warmup`` (at least 1) untimed alternated rounds come first, for the
    reason in the module docstring. Returns {batch: median seconds per row} of the built model."""
    from benchmarks.official_hift import official_and_ours, official_repo, run_official
    from cosyclone.code2wav.hift import build_hift

    policy = resolve(device, "fp32")
    repo = official_repo()
    official: Any = None
    hift: Any
    direct: Any
    if repo is not None:  # the same weights in all: cosyclone's vocoders load the official state dict
        official, hift, direct = official_and_ours(repo, cfg.hift, policy)
    else:  # HiFT always runs fp32 (its F0 part in fp64)
        hift, direct = (build_hift(cfg, policy, load_format="dummy", direct=d) for d in (False, True))
    fft = any(getattr(m, "fft_spec", None) is not None for m in hift.modules())
    if not fft:
        direct = None  # the build is the all-direct one already (accelerators)
    where = cpu_name() if policy.device.type == "cpu" else str(policy.device)
    out: dict[int, float] = {}
    for b in batches:
        gen = torch.Generator().manual_seed(b)
        mel = (torch.randn(b, 80, HIFT_MEL_FRAMES, generator=gen) * 2 - 6).to(policy.device)
        mel_len = torch.full((b,), HIFT_MEL_FRAMES, device=policy.device)
        runs: dict[str, Callable[[], object]] = {"built": partial(hift.inference, mel, mel_len)}
        if direct is not None:
            runs["direct"] = partial(direct.inference, mel, mel_len)
        if official is not None:
            runs["official"] = partial(run_official, official, mel)
        times: dict[str, list[float]] = {name: [] for name in runs}
        with torch.inference_mode():
            for _ in range(max(1, warmup)):  # kernels, noise table, and malloc past its first calls
                for run in runs.values():
                    run()
            for _ in range(max(1, reps)):
                for name, run in runs.items():  # alternated: the same window for all
                    times[name].append(_time(run, policy.device, 1))
            if direct is not None:
                wav, gap = hift.inference(mel, mel_len)[0], direct.inference(mel, mel_len)[0]
                gap = (wav - gap).abs().max().item() / max(gap.abs().max().item(), 1e-30)
        per_row = statistics.median(times["built"]) / b
        out[b] = per_row
        convs = "FFT convs" if fft else "direct convs"
        if official is not None:
            theirs = statistics.median(times["official"]) / b
            versus = (f"official {theirs:.3f} s per row in this window (same weights, one row at a time, "
                      f"alternated) = {theirs / per_row:.2f}x")
        else:
            versus = (
                f"vs official {OFFICIAL_HIFT_S:.2f} s per row = {OFFICIAL_HIFT_S / per_row:.2f}x [baseline "
                f"measured on another run/machine (Intel Xeon with AMX), not alternated with this run; "
                f"set COSYCLONE_BENCH_OFFICIAL to a CosyVoice checkout for a same-window ratio]"
            )
        print(
            f"HiFT fp32 batch {b} on {where} ({torch.get_num_threads()} threads), {convs}: {per_row:.3f} s "
            f"per row (4.0 s of audio, median of {len(times['built'])}) -> RTF {per_row / AUDIO_S:.3f}; "
            f"{versus}",
            flush=True,
        )
        if direct is not None:
            before = statistics.median(times["direct"]) / b
            print(
                f"HiFT fp32 batch {b}, all convs direct (alternated in this run): {before:.3f} s per row -> "
                f"FFT convs {before / per_row:.2f}x as fast; waveform max |diff| {gap:.2g} of its peak",
                flush=True,
            )
    return out

if __name__ == "__main__":
    main()
