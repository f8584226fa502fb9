"""Part 3 of ``benchmarks/gpu_check.sh``: a warm end-to-end night through the run-folder path
``cosyclone synth`` takes, as a user runs it: the default precision and the sizes the engine plans
for this device (no dtype or batch given), a distinct prompt per row, on full-size dummy weights
(``--tiny``: a tiny model, CPU-sized).

The frontend is the released geometry (:mod:`benchmarks.released_frontend`: the v3 speech tokenizer
and CAM++ at their released sizes, random weights, built here, offline), on the providers the run
takes (CUDA's where this onnxruntime offers it), so the frontend costs what a real night's does; its
prompts per second on one worker are measured first (``frontend_prompts_per_s``).

The model is loaded once; a warm-up folder runs first at the timed shape (as many rows as the timed
run, the same prompt lengths, prompts of its own: kernels, the allocator, the talker's cache and
the CUDA graph captures at the slots the timed run meets), then the timed folder of ``--rows`` rows
(default: one sized batch). Rows are long enough to reach code2wav's budgets: prompts of 5 to 29 s
(:data:`PROMPT_SECONDS`, mean 15.5 s) and targets capped at ``--max-tokens`` (the GPU check: 375
tokens, 15 s; random weights never stop), so a row is prompt + target = about the 30 s the sizing
rule plans each batch's HiFT frames and flow positions for. Why a folder and not
``synthesize_rows``: the folder's ``runs.jsonl`` line is what a user's run records (sizing, graph
steps, capture errors, peak memory, each stage's dtype and share, mean live slots). Those keys are
read defensively: every key of that line whose name speaks of slots, buckets, code2wav, memory,
peaks, dtypes, captures, graphs, shares or bounds is printed and kept in figures.jsonl as found.

Peak memory against the plan: the sizing rule plans for ``free x fraction`` of the memory free
after load; the timed run's peak reserved GPU memory is compared with what the weights took plus
that plan (``peak_vs_plan``; above 1 the plan did not hold, and the part fails).

It fails (exit 1) when a row failed, when the peak passed the plan, and on a CUDA device when no
decode step ran as a replayed graph or a capture failed (:func:`benchmarks.gpu_verdict.e2e_verdict`).
``--device cuda`` (the default) that torch cannot reach ends it within seconds (exit 3), never a CPU run.

    python -m benchmarks.gpu_e2e [--device cuda] [--max-tokens 375]
    python -m benchmarks.gpu_e2e --tiny --device cpu --dtype fp32 --rows 3 --batch 3 --n-timesteps 2 \
        --max-tokens 8 --frontend-layers 1
"""

from __future__ import annotations

import argparse
import json
import re
import resource
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
ENGINE_KEYS = re.compile(r"slot|bucket|code2wav|memory|peak|dtype|captur|graph|sizing|free|share|bound", re.I)


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


#: Prompt lengths the rows cycle through (seconds): short and long prompts in every batch, up to the
#: frontend's 30 s limit, mean 15.5 s (with a 15 s target, the sizing rule's 30 s design row).
PROMPT_SECONDS = (5.0, 25.0, 10.0, 20.0, 15.0, 29.0, 8.0, 12.0)


def distinct_prompts(folder: Path, n: int, salt: int) -> list[str]:
    """``n`` prompt WAVs of their own in ``folder`` (names relative to it): the bundled speakers'
    recordings joined and cut at an offset of each row's own to :data:`PROMPT_SECONDS` lengths, at a
    gain of its own, so no two share content (each is a prompt-cache miss, as in a real dataset)."""
    import numpy as np
    import soundfile as sf

    waves, rate = [], 0
    for k in (1, 2, 3):
        data, rate = sf.read(str(ROOT / "manifests" / "prompts" / f"speaker{k}.wav"), dtype="float32")
        waves.append(data if data.ndim == 1 else data.mean(axis=1))
    loop = np.concatenate(waves * 8)
    (folder / "prompts").mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        length = int(PROMPT_SECONDS[i % len(PROMPT_SECONDS)] * rate)
        start = (997 * (i + salt)) % (len(loop) - length)
        wave = loop[start:start + length] * (0.5 + 0.4 * ((i * 7 + salt) % 11) / 11)
        name = f"prompts/p{salt}_{i:03d}.wav"
        sf.write(str(folder / name), wave.astype(np.float32), rate)
        names.append(name)
    return names


def _write_manifest(folder: Path, rows: list[dict[str, str]], salt: int) -> Path:
    for row, prompt in zip(rows, distinct_prompts(folder, len(rows), salt), strict=True):
        row["prompt_audio"] = prompt
    path = folder / "manifest.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _find(obj: Any, key: str) -> Any:
    """The first value of ``key`` anywhere in a JSON object (None when absent)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def released_frontend(tts: Any, folder: Path, args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """Build the frontend of the released geometry into ``folder``, measure one worker's prompts per
    second on the run's providers, and put its sessions under ``tts``'s frontend (the run's prompt
    workers then pay what a real night pays). Its figures, ``frontend_*``."""
    from benchmarks.released_frontend import build, measure
    from cosyclone.frontend.onnx import OnnxModels, default_providers, set_intra_op_threads

    built = build(folder, layers=args.frontend_layers)
    provs = default_providers(backend)
    m = measure(folder, prompts=args.frontend_prompts, seconds=10.0, providers=provs)  # at one thread
    set_intra_op_threads(tts.engine.sizing.frontend_threads)  # the run's sessions: the sized threads
    frontend = tts.engine.stages.frontend
    frontend.onnx = OnnxModels(folder, provs)
    return {"frontend": f"released geometry ({built['tokenizer_weights'] / 1e6:.0f}M tokenizer weights, "
                        f"{built['tokenizer_layers']} blocks; CAM++ {built['campplus_weights'] / 1e6:.1f}M)",
            "frontend_build_s": built["built_s"], "frontend_providers": m["providers"],
            "frontend_prompt_s": m["prompt_s"], "frontend_prompts_per_s": m["prompts_per_s"],
            "frontend_measured_on": f"{m['prompts']} distinct prompts of 10 s, one worker, one thread"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load, build the frontend, warm up at the timed shape, time ``rows`` rows; the figures (see the
    module docstring)."""
    from cosyclone.api import CosyClone

    dev = require_device(args.device)
    extra: dict[str, Any] = {}
    for name in ("batch_size", "n_timesteps", "max_tokens"):
        if getattr(args, name) is not None:
            extra[name] = getattr(args, name)
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
        weights = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        if dev.type == "cuda":
            fig["gpu_free_gib_after_load"] = _gib(torch.cuda.mem_get_info(dev)[0])
        if args.frontend_layers:
            fig.update(released_frontend(tts, tmp / "frontend", args, tts.engine.policy.backend))
        batch = int(tts.options.batch_size or 1)  # the sized batch unless --batch-size was given
        n = args.rows or batch
        t0 = time.perf_counter()  # the warm-up: the timed shape (rows, prompt lengths), prompts of its own
        tts.synth_folder(_write_manifest(tmp / "warm_in", _rows(n), salt=1), tmp / "warm")
        _sync(dev)
        warm_s = time.perf_counter() - t0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        tts.synth_folder(_write_manifest(tmp / "run_in", _rows(n), salt=2), tmp / "run")
        _sync(dev)
        wall = time.perf_counter() - t0
        runs = _jsonl(tmp / "run" / "runs.jsonl")
        diags = _jsonl(tmp / "run" / "diagnostics.jsonl")
    fig.update(_figures(runs[-1] if runs else {}, diags, dev, tts, args, n=n, batch=batch))
    fig.update(load_s=round(load_s, 2), warmup_s=round(warm_s, 2), wall_s=round(wall, 3),
               rows_per_s=round(n / wall, 3))
    if fig["audio_s"]:
        fig["rtf"] = round(wall / fig["audio_s"], 4)
    if dev.type == "cuda":
        fig.update(peak_allocated_gib=_gib(torch.cuda.max_memory_allocated(dev)),
                   peak_reserved_gib=_gib(torch.cuda.max_memory_reserved(dev)))
        sizing = fig["sizing"]
        if sizing.get("free_bytes") and sizing.get("fraction"):  # the weights + what the rule may take
            plan = weights + float(sizing["free_bytes"]) * float(sizing["fraction"])
            fig.update(weights_gib=_gib(weights), plan_gib=_gib(plan),
                       peak_vs_plan=round(torch.cuda.max_memory_reserved(dev) / plan, 3))
    return fig


def _figures(record: dict[str, Any], diags: list[dict[str, Any]], dev: torch.device, tts: Any,
             args: argparse.Namespace, *, n: int, batch: int) -> dict[str, Any]:
    """What the timed folder's ``runs.jsonl`` line and diagnostics say: rows, audio, stage seconds
    and shares, graph steps, mean live slots (read defensively: an engine that does not record
    them gives None), the sizing."""
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
    found = record.get("cuda_graphs")
    graphs: dict[str, Any] = found if isinstance(found, dict) else {}
    sizing = _find(record, "sizing") or {}
    found_stages = _find(record, "stage_seconds")
    stage: dict[str, Any] = found_stages if isinstance(found_stages, dict) else {}
    fig: dict[str, Any] = {}
    fig.update({
        "device": f"{device_name(dev)} ({dev.type}, {tts.options.dtype}, "
                  f"{'tiny' if args.tiny else 'full-size dummy'} weights)",
        "rows": n, "ok": len(ok), "batch": batch, "sizing": sizing,
        "talker_slots": sizing.get("talker_slots") or _find(record, "talker_slots_used"),
        "distinct_prompts": n, "prompt_seconds": sorted(set(PROMPT_SECONDS)), "audio_s": round(audio, 2),
        "rtf": None, "max_tokens": args.max_tokens, "mean_live_slots": _find(record, "mean_live_slots"),
        "decode_buckets": _find(record, "decode_buckets"), "stage_shares": (stage.get("shares") or {}),
        "bound_by": stage.get("bound_by"),
        "speech_tokens": tokens, "stage_seconds": {k: round(v, 3) for k, v in sorted(stages.items())},
        "graph_steps": int(graphs.get("graph_steps", graph_steps)), "decode_steps": steps,
        "capture_errors": list(graphs.get("capture_errors") or []), "schedule": tts.options.schedule,
        "host_peak_rss_gib": _gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "errors": sorted({str(d.get("error")) for d in diags if d.get("status") != "ok"})[:3],
        "run_record": engine_fields(record), "runs_jsonl": bool(record)})
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
    shares = ", ".join(f"{k} {float(v):.0%}" for k, v in fig["stage_shares"].items())
    st += f"; bound by {fig['bound_by']} (busy of the wall: {shares or 'not recorded'})"
    live = fig.get("mean_live_slots")
    st += f"; mean live slots {live if live is not None else 'not recorded'} of {fig['talker_slots']}"
    if "frontend_prompts_per_s" in fig:
        st = (f"frontend {fig['frontend_prompts_per_s']} prompts/s per worker "
              f"({fig['frontend_providers'][0]}); ") + st
    mem = f", peak {fig['peak_allocated_gib']:.1f} GiB GPU" if "peak_allocated_gib" in fig else ""
    if "peak_vs_plan" in fig:
        mem += (f" ({fig['peak_reserved_gib']:.1f} reserved = {fig['peak_vs_plan']:.2f} of the plan's "
                f"{fig['plan_gib']:.1f})")
    emit(
        "e2e",
        fig,
        f"{fig['ok']}/{fig['rows']} rows (distinct prompts) at batch {fig['batch']}, "
        f"{fig['talker_slots']} slots: RTF {fig['rtf']}, "
        f"{fig['rows_per_s']} rows/s{mem}, {fig['host_peak_rss_gib']:.1f} GiB host; {st}; "
        f"graph steps {fig['graph_steps']}/{fig['decode_steps']}" + ("" if ok else f"; FAIL: {why}"),
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny model directory instead of full-size dummy weights"
    )
    ap.add_argument(
        "--device", default="cuda", help="cuda (default; none reachable: exit 3, never the CPU) | cpu"
    )
    ap.add_argument("--dtype", default="auto", help="auto (default: what synth takes) | mixed | bf16 | fp32")
    ap.add_argument("--rows", type=int, default=None, help="timed rows (default: two batches)")
    ap.add_argument("--batch", dest="batch_size", type=int, default=None,
                    help="rows per batch (default: what the engine sizes for the device)")
    ap.add_argument("--n-timesteps", type=int, default=None, help="flow Euler steps (default: the model's)")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap on speech tokens per segment")
    ap.add_argument("--frontend-layers", type=int, default=12,
                    help="the released-geometry tokenizer's blocks (12: released; 0: the built-in frontend)")
    ap.add_argument("--frontend-prompts", type=int, default=4,
                    help="distinct 10 s prompts its speed is measured on")
    args = ap.parse_args(argv)
    _deadline()
    fig = run(args)
    return 0 if report(fig, require_graphs=torch.device(args.device).type == "cuda") else 1


if __name__ == "__main__":
    sys.exit(main())
