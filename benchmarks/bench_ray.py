"""``--engine ray`` on CPU: which layout of threads per actor gets the most rows/s from a node's cores.

Usage: ``python -m benchmarks.bench_ray [--rows 8] [--batch 2] [--tokens 16] [--n-timesteps 2] [--dtype
fp32]``.

Three runs of the same rows, in one process, on full-size dummy weights (the released geometry,
random values; short rows so the bench takes minutes): the local engine at ``C`` torch threads
(``C`` = this machine's CPUs), ``C`` Ray actors x 1 thread, and 1 Ray actor x ``C`` threads, all
on the same planned batches (``--batch`` rows each) and the same batch code: the local run uses
``--schedule static`` (one batch at a time, what an actor does), so the three differ only in how
the cores are laid out. Each run's wall includes loading its model(s) (the Ray runs: starting
their actors, which load at the same time); the Ray cluster's own start is timed apart. ``compute``
is rows over the batches' stage seconds (``diagnostics.jsonl``'s ``seconds``, a batch's time shared
among its rows) per actor running at once: the rate once every actor has loaded, without Ray's
streaming (results come back in bursts, so arrival times say little on a few batches). It is the
figure the sizing rule of ``cosyclone/ray/plan.py`` (``DEFAULT_CPU_THREADS``) is chosen from: on a
long run the start is amortized and the compute rate is what a node delivers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.machine import cpu_name

if TYPE_CHECKING:
    from cosyclone.engine.outcome import RowResult

ROOT = Path(__file__).resolve().parents[1]


def _rows(folder: Path, n: int) -> list[Any]:
    from cosyclone.manifest import read_manifest

    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    texts = ("the quick brown fox jumps over the lazy dog", "tomorrow will be sunny with a light breeze",
             "please read this sentence slowly and calmly", "we walked along the quiet river bank")
    rows = [
        {
            "id": f"b{i:02d}",
            "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
            "prompt_text": "reference words for the speaker",
            "text": texts[i % len(texts)],
        }
        for i in range(n)
    ]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_manifest(folder / "m.jsonl").rows


def _timed(engine: Callable[[], Iterator[RowResult]]) -> tuple[list[float], float]:
    """Seconds from the start to each finished row, in arrival order (the last is the wall), and the
    rows' stage seconds summed (frontend, talker, flow, HiFT: a batch's time, shared out among its rows).
    A failed row fails the benchmark: its figures would not be a synthesis's."""
    arrivals: list[float] = []
    busy = 0.0
    t0 = time.perf_counter()
    for res in engine():
        if not res.ok:
            raise RuntimeError(f"row {res.id} failed: {res.error}")
        arrivals.append(time.perf_counter() - t0)
        busy += sum(res.seconds.values())
    return arrivals, busy


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=int(os.environ.get("COSYCLONE_BENCH_RAY_ROWS", "8")))
    p.add_argument("--batch", type=int, default=2, help="rows per planned batch")
    p.add_argument("--tokens", type=int, default=16, help="speech tokens per row (min = max)")
    p.add_argument("--n-timesteps", type=int, default=2, help="flow Euler steps")
    p.add_argument("--dtype", default="fp32")
    args = p.parse_args(argv)

    import ray
    import torch

    from cosyclone.base.device import resolve
    from cosyclone.engine import Engine
    from cosyclone.engine.batches import plan_batches
    from cosyclone.engine.stages import load_stages
    from cosyclone.frontend.tiny_assets import builtin_assets_dir
    from cosyclone.model.config import released_config
    from cosyclone.options import RunOptions
    from cosyclone.ray.plan import RayPlan
    from cosyclone.ray.pool import run_ray

    cores = os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-bench-ray-"))
    plans: dict[str, RayPlan] = {}
    try:
        cfg, policy = replace(released_config(), model_dir=builtin_assets_dir()), resolve("cpu", args.dtype)
        rows = _rows(tmp, args.rows)
        opts = RunOptions(batch_size=args.batch, max_tokens=args.tokens, min_tokens=args.tokens,
                          n_timesteps=args.n_timesteps, load_format="dummy", schedule="static",
                          dtype=args.dtype, cpu_gemm="auto")
        batches = plan_batches(rows, args.batch)

        def local() -> Iterator[RowResult]:
            before = torch.get_num_threads()
            torch.set_num_threads(cores)
            try:
                yield from Engine(load_stages(cfg, policy, opts.load_format), opts).run(batches=batches)
            finally:
                torch.set_num_threads(before)
                gc.collect()  # the driver's model goes before the actors load theirs

        def on_ray(actors: int, threads: int) -> Callable[[], Iterator[RowResult]]:
            def engine() -> Iterator[RowResult]:
                return run_ray(cfg, policy, opts, batches, num_actors=actors, actor_threads=threads,
                               on_plan=lambda plan: plans.__setitem__(f"{actors}x{threads}", plan))
            return engine

        runs = {f"local, {cores} torch threads": (1, _timed(local))}
        t0 = time.perf_counter()
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
        start = time.perf_counter() - t0
        try:
            runs[f"ray, {cores} actors x 1 thread"] = (cores, _timed(on_ray(cores, 1)))
            runs[f"ray, 1 actor x {cores} threads"] = (1, _timed(on_ray(1, cores)))
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(rows)
    print(
        f"[ray] {cpu_name()}, {cores} CPUs; full-size dummy weights ({args.dtype}), {n} rows x {args.tokens} "
        f"tokens, batches of {args.batch}, {args.n_timesteps} Euler steps, local engine --schedule static; "
        f"compute = rows over the batches' stage seconds per actor running at once "
        f"(no load, no Ray overhead):"
    )
    rates = {}
    for name, (running, (arrivals, busy)) in runs.items():
        wall = arrivals[-1]
        rates[name] = n / (busy / running) if busy > 0 else 0.0
        print(
            f"[ray]   {name}: {n / wall:.3f} rows/s over the wall {wall:.1f} s "
            f"(first row after {arrivals[0]:.1f} s), "
            f"compute {rates[name]:.3f} rows/s ({busy:.1f} stage s)"
        )
    local_rate, wide, deep = rates.values()
    print(
        f"[ray]   compute ratios: {cores} x 1 = {wide / deep:.2f}x 1 x {cores}; "
        f"{cores} x 1 = {wide / local_rate:.2f}x "
        f"local; 1 x {cores} = {deep / local_rate:.2f}x local; Ray cluster start {start:.1f} s, not counted"
    )
    for key, plan in plans.items():
        print(f"[ray]   plan {key}: {plan.actors} actors x {plan.threads} threads, {plan.num_cpus:g} CPU and "
              f"{plan.memory_bytes / 1e9:.1f} GB memory asked each")


if __name__ == "__main__":
    main()
