"""``--engine ray`` against the local engine: rows per second on the same manifest and tiny model.

Usage: ``python -m benchmarks.bench_ray [--rows 16] [--batch 4] [--tokens 40] [--actors 2]``.

Both engines run in this process on the same rows and write through the same writer: the local
engine (``pipeline.run``) at torch's default threads and at one thread, and ``ray_engine.run_ray``
with ``--actors`` CPU actors (half a CPU, one torch thread each) on a local Ray cluster of this
machine's CPUs. Both local figures are printed because on a busy machine (other processes on the
cores) torch's default multi-threaded run can be several times slower than a single thread, so the
fair measure of Ray's overhead is against whichever local run is faster. The
cluster's start is timed apart (a cluster is normally already up, ``ray start``); each engine's wall
includes loading its model(s), the ray one also its actors' start. On a 2-core machine there is no
gain to expect: the figures are Ray's overhead, a fixed start (worker processes, imports, one
model load per actor: ``first row after``) and a per-row part (``steady``: rows/s after the first
row arrived). On a tiny model the fixed start dominates the wall; on real runs it is amortized.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]


def _rows(folder: Path, n: int) -> list[Any]:
    from cosyclone.manifest import read_manifest

    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    texts = ("the quick brown fox jumps over the lazy dog", "tomorrow will be sunny with a light breeze",
             "please read this sentence slowly and calmly", "we walked along the quiet river bank")
    rows = [{"id": f"b{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
             "prompt_text": "reference words for the speaker", "text": texts[i % len(texts)]} for i in range(n)]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_manifest(folder / "m.jsonl").rows


def _timed(engine: Callable[[Callable[[Any], None]], None], out: Path, sample_rate: int) -> tuple[float, float]:
    """(wall seconds, seconds to the first written row) of one engine run through the writer."""
    from cosyclone.writer import BackgroundWriter, WriterOptions

    writer = BackgroundWriter(WriterOptions(out_dir=out, sample_rate=sample_rate), truncate=True)
    first: list[float] = []
    t0 = time.perf_counter()

    def submit(rec: Any) -> None:
        if not first:
            first.append(time.perf_counter() - t0)
        writer.submit(rec)

    try:
        engine(submit)
    finally:
        writer.close()
    return time.perf_counter() - t0, first[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=int(os.environ.get("COSYCLONE_BENCH_RAY_ROWS", "16")))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=40, help="speech tokens per row (min = max)")
    p.add_argument("--actors", type=int, default=2)
    args = p.parse_args(argv)

    import ray
    import torch

    from cosyclone.config import load_model_config
    from cosyclone.device import resolve
    from cosyclone.pipeline import RunOptions, load_stages, run
    from cosyclone.ray_engine import run_ray
    from cosyclone.tiny import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-bench-ray-"))
    try:
        make_tiny_model(tmp / "tiny")
        cfg, policy = load_model_config(tmp / "tiny"), resolve("cpu", "fp32")
        rows = _rows(tmp, args.rows)
        opts = RunOptions(batch_size=args.batch, max_tokens=args.tokens, min_tokens=args.tokens, n_timesteps=2)
        sr = cfg.hift.sampling_rate

        def local(threads: int) -> Callable[[Callable[[Any], None]], None]:
            def engine(submit: Callable[[Any], None]) -> None:
                before = torch.get_num_threads()
                torch.set_num_threads(threads)
                try:
                    run(load_stages(cfg, policy, opts.load_format), rows, opts, submit)
                finally:
                    torch.set_num_threads(before)
            return engine

        def on_ray(submit: Callable[[Any], None]) -> None:
            run_ray(cfg, policy, rows, opts, submit, num_actors=args.actors)

        threads = torch.get_num_threads()
        local_wall, local_first = _timed(local(threads), tmp / "local", sr)
        one_wall, one_first = _timed(local(1), tmp / "local1", sr)
        t0 = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        start = time.perf_counter() - t0
        try:
            ray_wall, ray_first = _timed(on_ray, tmp / "ray", sr)
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(rows)

    def steady(wall: float, first: float) -> float:
        return (n - 1) / (wall - first) if wall > first else 0.0

    best = min(local_wall, one_wall)
    print(f"[ray] {cpu_name()}, {os.cpu_count()} CPUs; tiny model, {n} rows x {args.tokens} tokens, batch "
          f"{args.batch}, fp32; rows/s (steady = after the first row):")
    for name, wall, first in ((f"local, {threads} torch threads", local_wall, local_first),
                              ("local, 1 torch thread", one_wall, one_first),
                              (f"ray, {args.actors} CPU actors x 1 thread", ray_wall, ray_first)):
        print(f"[ray]   {name}: {n / wall:.2f} rows/s (steady {steady(wall, first):.2f}), wall {wall:.1f} s, "
              f"first row after {first:.1f} s")
    fast_steady = max(steady(local_wall, local_first), steady(one_wall, one_first))
    print(f"[ray]   ray = {best / ray_wall:.2f}x the faster local run's rows/s over the whole wall (fixed start: "
          f"first row after {ray_first:.1f} s vs {min(local_first, one_first):.1f} s), "
          f"{steady(ray_wall, ray_first) / fast_steady:.2f}x its steady rows/s; cluster start {start:.1f} s, "
          f"not counted")


if __name__ == "__main__":
    main()
