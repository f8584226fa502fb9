"""The Python parts of ``benchmarks/gpu_check.sh``: the machine, ms per decode step (eager vs CUDA
graphs) and a warm end-to-end run; each prints one ``SUMMARY:`` line for the check's table and
its figures as one JSON line (appended to ``$GPU_CHECK_FIGURES`` when set).

Why this decode measure: on a GPU a decode step's cost is its host work (kernel launches), which
CUDA graphs remove; the weights of the released talker take about 0.15 ms to read on an H200. A
step is timed as the difference of two ``generate`` calls that decode N1 and N2 steps per row
(rows run exactly that long: stop ids blocked below N, max length N), so prefill, engine setup and
the graph captures (one shape: ``kv_bucket=None``, fixed capacity; the same captures in both
calls) cancel out. Tokens of the two modes are compared too: at the same batch shape the replayed
graph runs the eager step's kernels, so they must be equal.

Subcommands::

    python -m benchmarks.gpu_step env                                  # GPU, torch, CUDA
    python -m benchmarks.gpu_step steps [--tiny] [--device cuda] [--dtype bf16] [--batches 1,16,64]
    python -m benchmarks.gpu_step e2e [--tiny] [--rows 48] [--batch 16]   # warm end-to-end run
    python -m benchmarks.gpu_step manifest OUT.jsonl --rows 16          # rows for a synth run
    python -m benchmarks.gpu_step rtf RUN_FOLDER                        # RTF from the run's summary.json

``--tiny``: a tiny geometry and few steps, runnable on CPU (there "graphs" runs through
:class:`~cosyclone.talker.graphs.EagerCapture`, the wrapper without a graph: a structural check,
not a speed figure). Figures name the device they were measured on.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TEXT, PROMPT_SPEECH = 77, 50  # assembled prompt: 2 + 77 + 50 = 129 positions


def _deadline() -> None:
    """Under gpu_check.sh's timeout (``$GPU_CHECK_LIMIT`` s): dump every thread's traceback shortly
    before the interrupt, so a part stuck inside a CUDA call still says where."""
    limit = os.environ.get("GPU_CHECK_LIMIT")
    if limit:
        faulthandler.dump_traceback_later(max(5.0, float(limit) - 12.0), exit=False)


def emit(part: str, figures: dict[str, Any], summary: str) -> None:
    """The part's figures (one JSON line, also appended to ``$GPU_CHECK_FIGURES``) and its
    ``SUMMARY:`` line (the check's table shows the last one of each part)."""
    line = json.dumps({"part": part, **figures}, default=str)
    print(line, flush=True)
    path = os.environ.get("GPU_CHECK_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    print(f"SUMMARY: {summary}", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


def env(args: argparse.Namespace) -> None:
    """What the figures were measured on: GPU, torch, CUDA, and the precision the run will take."""
    import platform

    from benchmarks.machine import cpu_name

    fig: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                           "cpu": cpu_name(), "cores": os.cpu_count(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        fig.update(gpu=props.name, gpu_memory_gib=_gib(props.total_memory), capability=f"{props.major}.{props.minor}",
                   multiprocessors=props.multi_processor_count, bf16=torch.cuda.is_bf16_supported(),
                   cudnn=torch.backends.cudnn.version())
    from cosyclone.base.device import resolve

    policy = resolve("auto", "auto", "auto")
    fig.update(run_device=str(policy.device), run_dtype=policy.dtype_name)
    where = fig.get("gpu") or "no GPU (CPU only)"
    emit("env", fig, f"{where}; torch {torch.__version__}, CUDA {torch.version.cuda}; synth would run "
                     f"{policy.dtype_name} on {policy.device}")


def device_name(device: torch.device) -> str:
    """What the figures were measured on: the GPU's name, else the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from benchmarks.machine import cpu_name

    return cpu_name()


def _model(tiny: bool, device: torch.device, dtype: torch.dtype) -> Any:
    from cosyclone.base.device import DevicePolicy
    from cosyclone.model.checkpoint import init_dummy
    from cosyclone.model.config import QwenGeometry, TalkerConfig, released_config
    from cosyclone.talker.model import CosyVoice3LM, build_talker

    if not tiny:
        return build_talker(released_config(), DevicePolicy(device, dtype, device.type), load_format="dummy")
    cfg = TalkerConfig(qwen=QwenGeometry(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=96, vocab_size=300),
                       llm_input_size=64, llm_output_size=64, speech_token_size=6561)
    model = init_dummy(CosyVoice3LM(cfg).eval(), seed=1, std=0.05).to(device=device, dtype=dtype)
    model.llm_decoder.to(torch.float32)
    return model


def _requests(model: Any, batch: int, text_len: int, speech_len: int) -> list[Any]:
    from cosyclone.talker.decode import TalkerRequest

    g = torch.Generator().manual_seed(0)
    vocab, speech = model.cfg.qwen.vocab_size, model.cfg.speech_token_size
    return [TalkerRequest(row_id=f"r{i}", text_ids=torch.randint(0, vocab, (text_len,), generator=g), target_len=4,
                          prompt_speech_tokens=torch.randint(0, speech, (speech_len,), generator=g), seed=i)
            for i in range(batch)]


def _timed(model: Any, reqs: list[Any], steps: int, capacity: int, graphs: str,
           backend: Any) -> tuple[float, list, bool]:
    from cosyclone.talker.decode import DecodeOptions, generate

    seen: list[Any] = []
    opts = DecodeOptions(max_len_override=steps, min_len_override=steps, kv_bucket=None, capacity=capacity,
                         cuda_graphs=graphs, graph_backend=backend, on_graphs=lambda c, n: seen.append((c, n)))
    best, res = float("inf"), []
    for _ in range(2):
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        t0 = time.perf_counter()
        res = generate(model, reqs, opts)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        best = min(best, time.perf_counter() - t0)
    choice, captured = seen[-1]
    if graphs == "auto" and not choice.enabled:
        print(f"    note: graphs off: {choice.reason}", flush=True)
    used = any(getattr(r.diagnostics, "graph_steps", 0) for r in res)  # what ran, not what was asked
    return best, [r.raw_tokens for r in res], used


def steps(args: argparse.Namespace) -> dict[str, Any]:
    """ms per decode step at each batch, eager and graphed, on one model; peak memory per batch."""
    from cosyclone.talker.graphs import EagerCapture

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    tiny = bool(args.tiny)
    model = _model(tiny, device, dtype)
    n1, n2 = (4, 16) if tiny else (16, 80)
    text_len, speech_len = (6, 4) if tiny else (PROMPT_TEXT, PROMPT_SPEECH)
    capacity = text_len + speech_len + 2 + n2
    backend = None if device.type == "cuda" else EagerCapture()  # CPU: the wrapper, structurally
    where = f"{device_name(device)} ({device.type}, {args.dtype}, {'tiny' if tiny else 'full-size dummy'} weights)"
    print(f"decode step: ms per step, {n2 - n1} steps measured (difference of {n2}- and {n1}-step decodes), "
          f"KV capacity {capacity}, on {where}", flush=True)
    out: dict[str, Any] = {"device": where, "ms_per_step": {}}
    cells = []
    with torch.inference_mode():
        for b in [int(x) for x in args.batches.split(",")]:
            reqs = _requests(model, b, text_len, speech_len)
            row: dict[str, Any] = {}
            toks: dict[str, list] = {}
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for mode in ("off", "auto"):
                _timed(model, reqs, n1, capacity, mode, backend)  # warm-up (kernels, allocator, cuBLAS)
                t1, _, _ = _timed(model, reqs, n1, capacity, mode, backend)
                t2, toks[mode], used = _timed(model, reqs, n2, capacity, mode, backend)
                row["eager" if mode == "off" else "graphs"] = 1e3 * (t2 - t1) / (n2 - n1)
                if mode == "auto":
                    row["graphs_used"] = used
            row["tokens_equal"] = toks["off"] == toks["auto"]
            if device.type == "cuda":
                row["peak_allocated_gib"] = _gib(torch.cuda.max_memory_allocated(device))
                row["peak_reserved_gib"] = _gib(torch.cuda.max_memory_reserved(device))
            out["ms_per_step"][b] = row
            mem = (f", peak {row['peak_allocated_gib']:.2f} GiB allocated / {row['peak_reserved_gib']:.2f} reserved"
                   if "peak_allocated_gib" in row else "")
            ratio = f"{row['eager'] / row['graphs']:5.2f}x" if min(row["eager"], row["graphs"]) > 0 else "n/a"
            print(f"  batch {b:3d}: eager {row['eager']:8.3f} ms/step, graphs {row['graphs']:8.3f} ms/step "
                  f"({ratio}), graphs used: {row['graphs_used']}, "
                  f"tokens equal: {row['tokens_equal']}{mem}"
                  + ("  [CPU: graphs = EagerCapture stand-in, not a speed figure]" if backend is not None else ""),
                  flush=True)
            cells.append(f"b{b} {row['eager']:.2f}/{row['graphs']:.2f}"
                         + (f" ({row['peak_allocated_gib']:.1f}G)" if "peak_allocated_gib" in row else ""))
    equal = all(r["tokens_equal"] for r in out["ms_per_step"].values())
    used = all(r["graphs_used"] for r in out["ms_per_step"].values())
    emit("decode", out, f"{args.dtype} ms/step eager/graphs: {', '.join(cells)}; tokens equal: {equal}; "
                        f"graphs used: {used}")
    if not equal:
        raise SystemExit("graphs and eager decoded different tokens")
    if not used:
        raise SystemExit("graphs were asked for but no step ran as a replay")
    return out


def _rows(n: int) -> list[dict[str, str]]:
    """``n`` rows of mixed lengths over the three bundled prompts (paths relative to manifests/)."""
    words = ["the", "quiet", "harbour", "wakes", "as", "boats", "return", "with", "the", "morning", "light", "and", "gulls", "circle", "over", "the", "market", "stalls", "where", "fishermen", "call", "out", "the", "prices", "of", "the", "day"]
    return [{"id": f"row{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
             "prompt_text": "This is the reference speaker talking.",
             "text": " ".join(words[: 6 + (i * 5) % (len(words) - 6)]).capitalize() + "."} for i in range(n)]


def e2e(args: argparse.Namespace) -> dict[str, Any]:
    """A warm end-to-end run: the model loaded once, one warm-up batch, then ``rows`` rows timed."""
    from cosyclone.api import CosyClone

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    extra: dict[str, Any] = {"batch_size": args.batch}
    if args.n_timesteps:
        extra["n_timesteps"] = args.n_timesteps
    if args.max_tokens:
        extra["max_tokens"] = args.max_tokens
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            from cosyclone.engine.tiny import make_tiny_model

            model_dir, load = str(make_tiny_model(Path(tmp) / "model")), "auto"
        else:
            model_dir, load = None, "dummy"
        t0 = time.perf_counter()
        tts = CosyClone(model_dir, load_format=load, device=device, dtype=args.dtype, **extra)
        _sync(dev)
        load_s = time.perf_counter() - t0
    base = ROOT / "manifests"
    rows = _rows(args.rows)
    t0 = time.perf_counter()
    tts.synthesize_rows(rows[: args.batch], base=base)  # warm-up: kernels, allocator, graph captures
    _sync(dev)
    warm_s = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    res = tts.synthesize_rows(rows, base=base)
    _sync(dev)
    wall = time.perf_counter() - t0
    ok = [r for r in res if r.ok]
    audio = sum(len(r.audio) for r in ok if r.audio is not None) / tts.sample_rate
    stages: dict[str, float] = {}
    graph_steps, steps, tokens = 0, 0, 0
    for r in res:
        for k, v in (r.diagnostics.get("seconds") or {}).items():
            stages[k] = stages.get(k, 0.0) + float(v)
        for seg in r.diagnostics.get("sampler") or []:
            graph_steps += int(seg.get("graph_steps", 0))
            steps += int(seg.get("steps", 0))
        tokens += sum(r.diagnostics.get("tokens") or [])
    fig: dict[str, Any] = {
        "device": f"{device_name(dev)} ({dev.type}, {tts.options.dtype}, "
                  f"{'tiny' if args.tiny else 'full-size dummy'} weights)",
        "rows": len(res), "ok": len(ok), "batch": args.batch, "load_s": round(load_s, 2), "warmup_s": round(warm_s, 2),
        "wall_s": round(wall, 3), "audio_s": round(audio, 2), "rtf": round(wall / audio, 4) if audio else None,
        "rows_per_s": round(len(res) / wall, 3), "speech_tokens": tokens,
        "stage_seconds": {k: round(v, 3) for k, v in sorted(stages.items())},
        "graph_steps": graph_steps, "decode_steps": steps, "schedule": tts.options.schedule,
        "errors": sorted({str(r.error) for r in res if not r.ok})[:3]}
    if dev.type == "cuda":
        fig.update(peak_allocated_gib=_gib(torch.cuda.max_memory_allocated(dev)),
                   peak_reserved_gib=_gib(torch.cuda.max_memory_reserved(dev)))
    print("stage seconds are the rows' shares summed (stages overlap where code2wav has its own stream)")
    st = " ".join(f"{k} {v:.1f}s" for k, v in fig["stage_seconds"].items())
    mem = f", peak {fig['peak_allocated_gib']:.1f} GiB" if "peak_allocated_gib" in fig else ""
    emit("e2e", fig, f"{len(ok)}/{len(res)} rows at batch {args.batch}: RTF {fig['rtf']}, {fig['rows_per_s']} rows/s"
                     f"{mem}; {st}; graph steps {graph_steps}/{steps}")
    if len(ok) != len(res):
        raise SystemExit(f"{len(res) - len(ok)} rows failed: {fig['errors']}")
    return fig


def manifest(args: argparse.Namespace) -> None:
    """``rows`` rows of mixed lengths over the three bundled prompts, next to a copy of them."""
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "manifests" / "prompts", path.parent / "prompts", dirs_exist_ok=True)
    with path.open("w") as f:
        for row in _rows(args.rows):
            f.write(json.dumps(row) + "\n")
    print(f"wrote {args.rows} rows to {path}")


def rtf(args: argparse.Namespace) -> None:
    """RTF (wall seconds per audio second) of a finished run, from its summary.json."""
    run = json.loads((Path(args.folder) / "summary.json").read_text())["last_run"]
    opts = run.get("options", {})
    wall, audio = float(run["wall_seconds"]), float(run["audio_seconds"])
    print(f"RTF {wall / audio if audio > 0 else float('nan'):.4f} ({audio:.2f} audio s in {wall:.2f} wall s, "
          f"{run['done']} rows done, {run['failed']} failed; device {run.get('device')}, dtype {run.get('dtype')}, "
          f"cuda_graphs {opts.get('cuda_graphs')})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env")
    p = sub.add_parser("steps")
    p.add_argument("--tiny", action="store_true", help="tiny geometry, few steps (CPU-sized check)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--batches", default="1,16,64")
    p = sub.add_parser("e2e")
    p.add_argument("--tiny", action="store_true", help="a tiny model directory instead of full-size dummy weights")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPUs with bf16) | bf16 | fp32")
    p.add_argument("--rows", type=int, default=48)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--n-timesteps", type=int, default=None, help="flow Euler steps (default: the model's)")
    p.add_argument("--max-tokens", type=int, default=None, help="cap on speech tokens per segment")
    p = sub.add_parser("manifest")
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=16)
    p = sub.add_parser("rtf")
    p.add_argument("folder")
    args = ap.parse_args(argv)
    _deadline()
    {"env": env, "steps": steps, "e2e": e2e, "manifest": manifest, "rtf": rtf}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
