"""The flow per request against the machine's own GEMM rate on the flow's own shapes, per dtype.

Workload: BASELINE_CPU.md's request through the flow on full-size dummy weights: batch 1, 100
target tokens, a 75-token prompt with its (150, 80) mel, so the DiT runs at (2 x 350) frames (the
CFG pair), 22 blocks of width 1024, ``--steps`` Euler steps (10, the model's). Per dtype:

* ``flow_s``: the flow's wall time per request (best of ``--rounds``);
* every matrix product of that request is recorded (``bench_engine._record``: linear/conv/bmm
  calls with their FLOPs; attention through SDPA, where the flow calls it, as its two products
  QK^T and PV spelled as plain batched GEMMs of the same shapes) and replayed alone on the flow's
  own weights and fresh activations of the same shapes and strides, through the same aten/oneDNN
  ops, every operand in the flow's dtype (a product the flow runs wider, the bf16 attention's
  float32 scores, is replayed in bf16: its width counts as loss): ``gemm_gflops``, the machine's
  GEMM rate on the flow's own calls (``fraction_as_called``: replayed as called);
* ``fraction``: replay time over flow time, the flow's rate on those FLOPs over that rate (1.0: a
  flow that does nothing but its products at plain GEMM speed; norms, softmax, activations,
  copies and per-call overhead are what it loses);
* ``--profile``: the flow's own ops by self time for one Euler step (where the rest goes).

Timing: ``--rounds`` rounds of (flow, replay), best of each, so load from other processes on a
shared machine hits both sides of each ratio alike. Every figure names the CPU and whether it
has AMX: on a CPU without AMX the bf16 GEMM rate is far below an AMX Xeon's, so the fraction, not
the rate, is what compares across machines. bf16 is skipped on CPUs without native bf16 (it is
emulated there and not a configuration anyone should run).

Run: ``python -m benchmarks.bench_flow_gemm [--dtypes bf16 fp32] [--steps 10] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from benchmarks.bench_engine import _record, _replay, _weights
from benchmarks.machine import cpu_flags, cpu_name, native_bf16

TOKENS, PROMPT_TOKENS = 100, 75


def _best(fn: Any, repeats: int = 1) -> float:
    """Best time of ``repeats`` calls: wall time, or with one thread the process's CPU time (what
    other processes on a shared machine take from it is then not counted on either side)."""
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def has_amx() -> bool:
    """Whether the CPU reports AMX tiles with bf16 (``amx_bf16`` and ``amx_tile`` flags)."""
    return {"amx_bf16", "amx_tile"} <= cpu_flags()


def _inputs(cfg: Any) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randint(0, cfg.flow.vocab_size, (1, TOKENS), generator=gen),
        torch.tensor([TOKENS]),
        torch.randint(0, cfg.flow.vocab_size, (1, PROMPT_TOKENS), generator=gen),
        torch.tensor([PROMPT_TOKENS]),
        torch.randn(1, 2 * PROMPT_TOKENS, 80, generator=gen),
        torch.randn(1, 192, generator=gen),
    )


def _in_dtype(calls: dict[Any, list[Any]], dtype: torch.dtype) -> dict[Any, list[Any]]:
    """The same calls with every floating operand in ``dtype`` (same shapes and strides): a product
    the flow runs wider (the bf16 attention's float32 scores) is replayed at the ``dtype`` rate."""

    def cast(v: Any) -> Any:
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    return {key: [(func, tuple(cast(a) for a in args), {k: cast(v) for k, v in kw.items()}), n]
            for key, ((func, args, kw), n) in calls.items()}


def flow_fraction(dtype: str, steps: int = 10, rounds: int = 2, profile: bool = False) -> dict[str, Any]:
    """The flow's per-request time and its fraction of the GEMM rate on its own calls in ``dtype``."""
    from cosyclone.base.device import resolve
    from cosyclone.code2wav.flow import build_flow
    from cosyclone.model.config import released_config

    cfg = released_config()
    policy = resolve("cpu", dtype)
    flow = build_flow(cfg, policy, load_format="dummy")
    x = _inputs(cfg)

    def run() -> None:
        flow.inference(*x, n_timesteps=steps)

    with torch.inference_mode():
        flow.inference(*x, n_timesteps=1)  # warm-up (kernels, allocator)
    rec = _record(run, _weights(flow))
    jobs = {
        "gemm": _in_dtype(rec["calls"], policy.dtype),
        "as_called": rec["calls"],
        "attn_gemm": rec["attn_gemms"],
    }
    best = dict.fromkeys(("flow", *jobs), float("inf"))
    with torch.inference_mode():
        _replay(jobs["gemm"])
        for _ in range(rounds):
            best["flow"] = min(best["flow"], _best(run, 1))
            for k, calls in jobs.items():
                best[k] = min(best[k], _best(lambda c=calls: _replay(c), 1))
    gemm_flop, attn_flop = rec["flops"]
    flop, t_gemm = gemm_flop + attn_flop, best["gemm"] + best["attn_gemm"]
    out = {
        "dtype": dtype,
        "flow_s": round(best["flow"], 3),
        "gemm_replay_s": round(t_gemm, 3),
        "fraction": round(t_gemm / best["flow"], 3),
        "flow_gflops": round(flop / best["flow"] / 1e9, 1),
        "gemm_gflops": round(flop / t_gemm / 1e9, 1),
        "gflop": round(flop / 1e9, 1),
        "fraction_as_called": round((best["as_called"] + best["attn_gemm"]) / best["flow"], 3),
        "sdpa_calls": sum(n for _, n in rec["attn_calls"].values()),
        "gemm_calls": sum(n for _, n in rec["calls"].values()),
        "uncounted_ops": sorted(rec["unknown"]),
        "cpu_gemm": policy.cpu_gemm,
        "threads": torch.get_num_threads(),
        "workload": f"batch 1 (CFG pair: 2 x {2 * (TOKENS + PROMPT_TOKENS)} frames), {TOKENS} tokens, "
        f"{PROMPT_TOKENS} prompt tokens, {steps} Euler step{'s' * (steps != 1)}, full-size dummy weights",
    }
    if profile:
        out["profile"] = _profile(lambda: flow.inference(*x, n_timesteps=1))
    return out


def _profile(fn: Any, top: int = 12) -> list[str]:
    """The ops of ``fn()`` by self CPU time: ``"name ms share"`` for the ``top`` largest."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = [(e.self_cpu_time_total, e.key) for e in prof.key_averages()]
    total = sum(t for t, _ in rows) or 1.0
    return [f"{k} {t / 1e3:.1f} ms {t / total:.0%}" for t, k in sorted(rows, reverse=True)[:top]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=10, help="Euler steps per request (the model's: 10)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (flow, replay), best of each")
    ap.add_argument(
        "--threads", type=int, default=2, help="1: timed in process CPU time (for a shared machine)"
    )
    ap.add_argument("--profile", action="store_true", help="also list the flow's ops by self time (1 step)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = "CPU time" if torch.get_num_threads() == 1 else "wall time"
    where = f"{cpu_name()}, AMX {'yes' if has_amx() else 'no'}, {torch.get_num_threads()} threads, {clock}"
    for dtype in args.dtypes:
        if dtype == "bf16" and not native_bf16():
            print(f"flow bf16: skipped, this CPU has no native bf16 (emulated there) [{where}]", flush=True)
            continue
        t0 = time.perf_counter()
        r = flow_fraction(dtype, args.steps, args.rounds, args.profile)
        print(
            f"flow {dtype} per request ({r['workload']}): {r['flow_s']:.2f} s, "
            f"{r['flow_gflops']:.0f} GFLOP/s "
            f"on its {r['gflop']:.0f} GFLOP of products = {r['fraction']:.2f} of the {dtype} GEMM rate "
            f"on its own shapes ({r['gemm_gflops']:.0f} GFLOP/s, same ops replayed alone; "
            f"linear layers on {r['cpu_gemm']}) "
            f"[{where}; measured in {time.perf_counter() - t0:.0f} s]",
            flush=True,
        )
        if r["uncounted_ops"]:
            print(f"  GEMM-like ops not counted: {r['uncounted_ops']}")
        for line in r.get("profile", []):
            print(f"  {line}")
        if args.json:
            print(json.dumps({**r, "device": cpu_name(), "amx": has_amx()}))


if __name__ == "__main__":
    main()
