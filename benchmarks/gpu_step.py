"""Milliseconds per talker decode step, eager vs CUDA graphs, and the helpers of ``gpu_check.sh``.

Why this measure: on a GPU a decode step's cost is its host work (kernel launches), which CUDA
graphs remove; the weights of the released talker take about 0.15 ms to read on an H200. A step
is timed as the difference of two ``generate`` calls that decode N1 and N2 steps per row (rows
run exactly that long: stop ids blocked below N, max length N), so prefill, engine setup and the
graph captures (one shape: ``kv_bucket=None``, fixed capacity; the same captures in both calls)
cancel out. Tokens of the two modes are compared too (they must be equal).

Subcommands::

    python -m benchmarks.gpu_step steps [--tiny] [--device cuda] [--dtype bf16] [--batches 1,16,64]
    python -m benchmarks.gpu_step manifest OUT.jsonl --rows 16     # rows for the RTF run
    python -m benchmarks.gpu_step rtf RUN_FOLDER                    # RTF from the run's summary.json

``--tiny``: a tiny geometry and few steps, runnable on CPU (there "graphs" runs through
:class:`~cosyclone.talker.graphs.EagerCapture`, the wrapper without a graph: a structural check,
not a speed figure). Figures name the device they were measured on.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TEXT, PROMPT_SPEECH = 77, 50  # assembled prompt: 2 + 77 + 50 = 129 positions


def device_name(device: torch.device) -> str:
    """What the figures were measured on: the GPU's name, else the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from benchmarks.machine import cpu_name

    return cpu_name()


def _model(tiny: bool, device: torch.device, dtype: torch.dtype) -> Any:
    from cosyclone.checkpoint import init_dummy
    from cosyclone.config import QwenGeometry, TalkerConfig, released_config
    from cosyclone.device import DevicePolicy
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


def _timed(model: Any, reqs: list[Any], steps: int, capacity: int, graphs: str, backend: Any) -> tuple[float, list]:
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
    return best, [r.raw_tokens for r in res]


def steps(args: argparse.Namespace) -> dict[str, Any]:
    """ms per decode step at each batch, eager and graphed, on one model."""
    from cosyclone.talker.graphs import EagerCapture

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    tiny = bool(args.tiny)
    model = _model(tiny, device, dtype)
    n1, n2 = (3, 7) if tiny else (16, 80)
    text_len, speech_len = (6, 4) if tiny else (PROMPT_TEXT, PROMPT_SPEECH)
    capacity = text_len + speech_len + 2 + n2
    backend = None if device.type == "cuda" else EagerCapture()  # CPU: the wrapper, structurally
    where = f"{device_name(device)} ({device.type}, {args.dtype}, {'tiny' if tiny else 'full-size dummy'} weights)"
    print(f"decode step: ms per step, {n2 - n1} steps measured (difference of {n2}- and {n1}-step decodes), "
          f"KV capacity {capacity}, on {where}", flush=True)
    out: dict[str, Any] = {"device": where, "ms_per_step": {}}
    with torch.inference_mode():
        for b in [int(x) for x in args.batches.split(",")]:
            reqs = _requests(model, b, text_len, speech_len)
            row: dict[str, Any] = {}
            toks: dict[str, list] = {}
            for mode in ("off", "auto"):
                _timed(model, reqs, n1, capacity, mode, backend)  # warm-up (kernels, allocator, cuBLAS)
                t1, _ = _timed(model, reqs, n1, capacity, mode, backend)
                t2, toks[mode] = _timed(model, reqs, n2, capacity, mode, backend)
                row["eager" if mode == "off" else "graphs"] = 1e3 * (t2 - t1) / (n2 - n1)
            row["tokens_equal"] = toks["off"] == toks["auto"]
            out["ms_per_step"][b] = row
            print(f"  batch {b:3d}: eager {row['eager']:8.3f} ms/step, graphs {row['graphs']:8.3f} ms/step "
                  f"({row['eager'] / max(row['graphs'], 1e-9):5.2f}x), tokens equal: {row['tokens_equal']}"
                  + ("  [CPU: graphs = EagerCapture stand-in, not a speed figure]" if backend is not None else ""),
                  flush=True)
    print(json.dumps(out), flush=True)
    if not all(r["tokens_equal"] for r in out["ms_per_step"].values()):
        raise SystemExit("graphs and eager decoded different tokens")
    return out


def manifest(args: argparse.Namespace) -> None:
    """``rows`` rows of mixed lengths over the three bundled prompts, next to a copy of them."""
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "manifests" / "prompts", path.parent / "prompts", dirs_exist_ok=True)
    words = ["the", "quiet", "harbour", "wakes", "as", "boats", "return", "with", "the", "morning", "light", "and", "gulls", "circle", "over", "the", "market", "stalls", "where", "fishermen", "call", "out", "the", "prices", "of", "the", "day"]
    with path.open("w") as f:
        for i in range(args.rows):
            text = " ".join(words[: 6 + (i * 5) % (len(words) - 6)]).capitalize() + "."
            f.write(json.dumps({"id": f"row{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
                                "prompt_text": "This is the reference speaker talking.", "text": text}) + "\n")
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
    p = sub.add_parser("steps")
    p.add_argument("--tiny", action="store_true", help="tiny geometry, few steps (CPU-sized check)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--batches", default="1,16,64")
    p = sub.add_parser("manifest")
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=16)
    p = sub.add_parser("rtf")
    p.add_argument("folder")
    args = ap.parse_args(argv)
    {"steps": steps, "manifest": manifest, "rtf": rtf}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
