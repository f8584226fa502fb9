"""Part 3 of ``benchmarks/gpu_check.sh``: a warm end-to-end run through the run-folder path
``cosyclone synth`` takes, on full-size dummy weights (``--tiny``: a tiny model, CPU-sized).

The model is loaded once; a warm-up folder of one batch runs first (kernels, the allocator, the
CUDA graph captures, which the engine keeps per process and reuses across sessions), then the
timed folder of ``--rows`` rows. Why a folder and not ``synthesize_rows``: the folder's
``runs.jsonl`` line is what a user's run records (graph steps, capture errors, and whatever the
engine adds: talker slots and code2wav batch sized from free memory, captures made and reused,
peak host and GPU memory, each stage's dtype). Those keys are read defensively: every key of that
line whose name speaks of slots, code2wav, memory, peaks, dtypes, captures or graphs is printed
and kept in figures.jsonl as found, and a key the engine does not write yet is simply absent.

It fails (exit 1) when a row failed, and on a CUDA device when no decode step ran as a replayed
graph or a capture failed (:func:`benchmarks.gpu_verdict.e2e_verdict`): a GPU run that decodes
eagerly has not shown what the GPU path is for. ``--device cuda`` (the default) that torch cannot
reach ends it within seconds (exit 3), never a CPU run.

    python -m benchmarks.gpu_e2e [--device cuda] [--dtype bf16] [--rows 48] [--batch 16] [--max-tokens 200]
    python -m benchmarks.gpu_e2e --tiny --device cpu --dtype fp32 --rows 6 --batch 3 --n-timesteps 2 --max-tokens 8
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_step import _deadline, _gib, _rows, device_name, emit, require_device
from benchmarks.gpu_verdict import e2e_verdict

ROOT = Path(__file__).resolve().parents[1]

#: Key names of a runs.jsonl line that the check keeps and prints, wherever they sit in it.
ENGINE_KEYS = re.compile(r"slot|code2wav|memory|peak|dtype|captur|graph|sizing|free", re.I)


def engine_fields(record: dict[str, Any]) -> dict[str, Any]:
    """Every key of a runs.jsonl line (dotted path -> value) whose name matches :data:`ENGINE_KEYS`,
    its value kept whole: what the engine reported about sizing, memory, dtypes and graphs."""
    found: dict[str, Any] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                p = f"{path}.{k}" if path else str(k)
                if ENGINE_KEYS.search(str(k)):
                    found[p] = v
                else:
                    walk(v, p)

    walk(record, "")
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _write_manifest(folder: Path, rows: list[dict[str, str]]) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    path = folder / "manifest.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load, warm up, time ``rows`` rows; the figures (see the module docstring)."""
    from cosyclone.api import CosyClone

    dev = require_device(args.device)
    extra: dict[str, Any] = {"batch_size": args.batch}
    if args.n_timesteps:
        extra["n_timesteps"] = args.n_timesteps
    if args.max_tokens:
        extra["max_tokens"] = args.max_tokens
    fig: dict[str, Any] = {}
    if dev.type == "cuda":
        fig["gpu_free_gib_at_start"] = _gib(torch.cuda.mem_get_info(dev)[0])
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if args.tiny:
            from cosyclone.engine.tiny import make_tiny_model

            model_dir, load = str(make_tiny_model(tmp / "model")), "auto"
        else:
            model_dir, load = None, "dummy"
        t0 = time.perf_counter()
        tts = CosyClone(model_dir, load_format=load, device=args.device, dtype=args.dtype, **extra)
        _sync(dev)
        load_s = time.perf_counter() - t0
        if dev.type == "cuda":
            fig["gpu_free_gib_after_load"] = _gib(torch.cuda.mem_get_info(dev)[0])
        rows = _rows(args.rows)
        t0 = time.perf_counter()
        tts.synth_folder(_write_manifest(tmp / "warm_in", rows[: args.batch]), tmp / "warm")
        _sync(dev)
        warm_s = time.perf_counter() - t0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        tts.synth_folder(_write_manifest(tmp / "run_in", rows), tmp / "run")
        _sync(dev)
        wall = time.perf_counter() - t0
        runs = _jsonl(tmp / "run" / "runs.jsonl")
        diags = _jsonl(tmp / "run" / "diagnostics.jsonl")
    record = runs[-1] if runs else {}
    ok = [d for d in diags if d.get("status") == "ok"]
    audio = float(record.get("audio_seconds") or sum(float(d.get("audio_seconds") or 0) for d in ok))
    stages: dict[str, float] = {}
    steps, graph_steps, tokens = 0, 0, 0
    for d in diags:
        for k, v in (d.get("seconds") or {}).items():
            stages[k] = stages.get(k, 0.0) + float(v)
        for seg in d.get("sampler") or []:
            graph_steps += int(seg.get("graph_steps", 0))
            steps += int(seg.get("steps", 0))
        tokens += sum(d.get("tokens") or [])
    graphs = record.get("cuda_graphs") if isinstance(record.get("cuda_graphs"), dict) else {}
    fig.update({
        "device": f"{device_name(dev)} ({dev.type}, {tts.options.dtype}, "
                  f"{'tiny' if args.tiny else 'full-size dummy'} weights)",
        "rows": args.rows, "ok": len(ok), "batch": args.batch, "load_s": round(load_s, 2),
        "warmup_s": round(warm_s, 2), "wall_s": round(wall, 3), "audio_s": round(audio, 2),
        "rtf": round(wall / audio, 4) if audio else None, "rows_per_s": round(args.rows / wall, 3),
        "speech_tokens": tokens, "stage_seconds": {k: round(v, 3) for k, v in sorted(stages.items())},
        "graph_steps": int(graphs.get("graph_steps", graph_steps)), "decode_steps": steps,
        "capture_errors": list(graphs.get("capture_errors") or []), "schedule": tts.options.schedule,
        "host_peak_rss_gib": _gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "errors": sorted({str(d.get("error")) for d in diags if d.get("status") != "ok"})[:3],
        "run_record": engine_fields(record), "runs_jsonl": bool(record)})
    if dev.type == "cuda":
        fig.update(peak_allocated_gib=_gib(torch.cuda.max_memory_allocated(dev)),
                   peak_reserved_gib=_gib(torch.cuda.max_memory_reserved(dev)))
    return fig


def report(fig: dict[str, Any], require_graphs: bool) -> bool:
    """Print the figures, the runs.jsonl keys found, the one SUMMARY line; True when it passes."""
    print("stage seconds are the rows' shares summed (stages overlap where code2wav has its own stream)")
    print(f"runs.jsonl keys on sizing, memory, dtypes and graphs ({len(fig['run_record'])} found"
          + ("" if fig["runs_jsonl"] else "; NO runs.jsonl line was written") + "):")
    for k, v in fig["run_record"].items():
        print(f"  {k}: {json.dumps(v, default=str)[:300]}")
    ok, why = e2e_verdict(fig, require_graphs)
    st = " ".join(f"{k} {v:.1f}s" for k, v in fig["stage_seconds"].items())
    mem = f", peak {fig['peak_allocated_gib']:.1f} GiB GPU" if "peak_allocated_gib" in fig else ""
    emit("e2e", fig, f"{fig['ok']}/{fig['rows']} rows at batch {fig['batch']}: RTF {fig['rtf']}, "
                     f"{fig['rows_per_s']} rows/s{mem}, {fig['host_peak_rss_gib']:.1f} GiB host; {st}; "
                     f"graph steps {fig['graph_steps']}/{fig['decode_steps']}" + ("" if ok else f"; FAIL: {why}"))
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model directory instead of full-size dummy weights")
    ap.add_argument("--device", default="cuda", help="cuda (default; none reachable: exit 3, never the CPU) | cpu")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on GPUs with bf16) | bf16 | fp32")
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--n-timesteps", type=int, default=None, help="flow Euler steps (default: the model's)")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap on speech tokens per segment")
    args = ap.parse_args(argv)
    _deadline()
    fig = run(args)
    return 0 if report(fig, require_graphs=torch.device(args.device).type == "cuda") else 1


if __name__ == "__main__":
    sys.exit(main())
