"""The host's ceiling: the real job from manifest to folder over stand-in model stages.

Why: a GPU night is only as fast as the Python around the card. Everything but the models runs for
real here: the streamed manifest, fingerprints, the resume plan, batch planning, the pipeline's
scheduler and prompt look-ahead, the writer (an atomic file and a record per row), the folder's
index, the stage-0 token checkpoint, metadata and the summary. The stages are stand-ins
(``tests/stand_in_stages.py``, injected through :class:`~cosyclone.engine.stage_ops.StageOps`, as
the other benchmarks import test helpers): with ``--costs zero`` they cost nothing, so the rows per
second are the host's own ceiling; with ``--costs h100`` they sleep like the H100 cost table
(:data:`H100`), and the talker's idle-with-work seconds say whether the host ever made the card wait.

Reported: rows per second overall and for each tenth of the night (a host whose cost per row grows
shows a slower last tenth), the RSS after the first tenth, at the end and at its peak, and the
seconds from the last row to the job's return (the run's end: settle, token tidy, accounts).
``--json``: the last line is one JSON object (``rows_per_s``, ``tenths``, ``rss_mb_first_tenth``,
``rss_mb_end``, ``rss_mb_peak``, ``exit_tail_s``; with ``--costs h100`` also ``talker_busy_s`` and
``talker_idle_with_work_s``).

    python -m benchmarks.bench_host --rows 100000 --json
    python -m benchmarks.bench_host --rows 1000 --costs h100 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from cosyclone.engine import RowResult
from cosyclone.options import RunOptions
from cosyclone.run.job import SynthJob
from tests.stand_in_stages import Costs, StandInRunEngine

#: Audio seconds each stand-in row stands for (its decode steps at 25 tokens a second; code2wav's cost).
ROW_AUDIO_S = 2.0
#: The H100 cost table's stage times (docs/performance.md): a prompt 1.4 s on one of 14 workers, a decode
#: step 41 ms (one stand-in window is one step), code2wav 5 ms per audio second.
H100 = Costs(prompt_s=1.4, window_s=0.041, code2wav_s=0.005 * ROW_AUDIO_S, steps=int(25 * ROW_AUDIO_S),
             prompt_cache=True)
ZERO = Costs(steps=3)
H100_WORKERS, H100_SLOTS = 14, 256  # the cost table's prompt workers and decode slots


@dataclass(frozen=True)
class HostConfig:
    """One benchmark run."""

    rows: int  # manifest rows
    costs: str  # "zero" or "h100"
    prompts: int  # distinct prompt files the rows share
    batch_size: int  # rows per batch
    out: Path  # the run's folder (and the manifest's)


class Tenths:
    """The progress sink: each row's commit time, and the RSS after each tenth."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.times: list[float] = []
        self.rss: list[float] = []
        self.t0 = time.perf_counter()

    def __call__(self, count: int) -> Tenths:
        return self

    def update(self, result: RowResult) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) % max(1, self.total // 10) == 0:
            self.rss.append(rss_mb())

    def close(self) -> None:
        pass

    def per_tenth(self) -> list[float]:
        """Rows per second of each tenth of the rows (the first from the run's start)."""
        n = len(self.times)
        edges = [round(n * k / 10) for k in range(11)]
        out = []
        for a, b in zip(edges, edges[1:], strict=False):
            if b <= a:
                continue
            start = self.t0 if a == 0 else self.times[a - 1]
            out.append((b - a) / max(self.times[b - 1] - start, 1e-9))
        return out


def rss_mb() -> float:
    """This process's resident memory now, in MB."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 1e6


def write_inputs(cfg: HostConfig) -> Path:
    """``cfg.prompts`` short prompt WAVs and a manifest of ``cfg.rows`` rows sharing them, round robin."""
    prompts = cfg.out / "prompts"
    prompts.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in range(cfg.prompts):
        sf.write(prompts / f"p{k}.wav", (0.1 * rng.standard_normal(8000)).astype(np.float32), 16000)
    manifest = cfg.out / "manifest.jsonl"
    with manifest.open("w") as fh:
        for i in range(cfg.rows):
            prompt = str(prompts / f"p{i % cfg.prompts}.wav")
            fh.write(json.dumps({"id": f"r{i:07d}", "prompt_audio": prompt, "prompt_text": "reference words",
                                 "text": f"row number {i} of the night"}) + "\n")
    return manifest


def run(cfg: HostConfig) -> dict[str, Any]:
    """One job over the stand-in stages; its figures."""
    h100 = cfg.costs == "h100"
    costs = H100 if h100 else ZERO
    run_opts: dict[str, Any] = {
        "batch_size": cfg.batch_size, "code2wav_thread": True,  # code2wav on its own thread, as on a GPU
        "talker_slots": H100_SLOTS if h100 else None, "frontend_workers": H100_WORKERS if h100 else None}
    # dummy: the stand-in engine reads no talker file (a real load_format would look for llm.pt)
    model: dict[str, Any] = {"load_format": "dummy", "device": "cpu", "dtype": "fp32", "cpu_gemm": "aten",
                             "text_frontend": "none"}
    engine = StandInRunEngine(costs, RunOptions(cuda_graphs="off", **model, **run_opts))
    manifest = write_inputs(cfg)
    job = SynthJob.open(manifest, cfg.out / "run", loaded=engine, **model, **run_opts)
    sink = Tenths(cfg.rows)
    sink.t0 = time.perf_counter()
    summary = job.run(progress=sink)
    end = time.perf_counter()
    if len(sink.times) != cfg.rows or summary.failed:
        raise SystemExit(f"bench_host: {len(sink.times)} of {cfg.rows} rows committed, "
                         f"{len(summary.failed)} failed")
    tenths = sink.per_tenth()
    out: dict[str, Any] = {
        "rows": cfg.rows, "costs": cfg.costs, "prompts": cfg.prompts, "batch_size": cfg.batch_size,
        "rows_per_s": round(cfg.rows / (sink.times[-1] - sink.t0), 1),
        "tenths": [round(t, 1) for t in tenths],
        "last_over_first": round(tenths[-1] / tenths[0], 3) if tenths else None,
        "rss_mb_first_tenth": round(sink.rss[0], 1) if sink.rss else None,
        "rss_mb_end": round(rss_mb(), 1),
        "rss_mb_peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1),  # KiB
        "exit_tail_s": round(end - sink.times[-1], 3),
    }
    if h100 and engine.clock is not None:
        seconds = engine.clock.seconds()
        out["talker_busy_s"] = round(seconds.talker.busy, 3)
        out["talker_idle_with_work_s"] = round(seconds.talker_idle_with_work, 3)
        out["idle_share"] = round(seconds.talker_idle_with_work / max(seconds.talker.busy, 1e-9), 4)
    return out


def describe(fig: dict[str, Any]) -> str:
    lines = [f"host ceiling, {fig['rows']} rows, stand-in stages ({fig['costs']}), {fig['prompts']} prompts, "
             f"batch {fig['batch_size']}, WAV of 10 samples a row:",
             f"  {fig['rows_per_s']} rows/s overall; tenths {fig['tenths']} "
             f"(last/first {fig['last_over_first']})",
             f"  RSS {fig['rss_mb_first_tenth']} MB after the first tenth, {fig['rss_mb_end']} MB at the end,"
             f" peak {fig['rss_mb_peak']} MB; {fig['exit_tail_s']} s from the last row to the job's return"]
    if "talker_busy_s" in fig:
        lines.append(f"  talker busy {fig['talker_busy_s']} s, idle with work "
                     f"{fig['talker_idle_with_work_s']} s ({100 * fig['idle_share']:.2f}%)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_host", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=int(os.environ.get("COSYCLONE_BENCH_HOST_ROWS", "100000")),
                    help="manifest rows ($COSYCLONE_BENCH_HOST_ROWS, 100000)")
    ap.add_argument("--costs", choices=("zero", "h100"), default="zero", help="stand-in stage costs (zero)")
    ap.add_argument("--prompts", type=int, default=16, help="distinct prompt files the rows share (16)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per batch (16)")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        cfg = HostConfig(rows=args.rows, costs=args.costs, prompts=args.prompts, batch_size=args.batch_size,
                         out=args.out or Path(tmp))
        fig = run(cfg)
    print(describe(fig))
    if args.json:
        print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
