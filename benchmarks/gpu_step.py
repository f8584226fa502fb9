"""The Python parts of ``benchmarks/gpu_check.sh``: the machine and ms per decode step (eager vs
CUDA graphs); the end-to-end part is ``benchmarks/gpu_e2e.py``, the verdicts
``benchmarks/gpu_verdict.py``. Each prints one ``SUMMARY:`` line for the check's table and its
figures as one JSON line (appended to ``$GPU_CHECK_FIGURES`` when set).

No silent CPU fallback: ``--device`` is what runs (default ``cuda``), and a ``cuda`` that torch
cannot reach ends the part within seconds, saying why (a CPU build of torch, no driver, no
visible device), instead of measuring the CPU under a GPU's name. Only the dry run asks for
``--device cpu``, and says so in every figure.

Why this decode measure: on a GPU a decode step's cost is its host work (kernel launches), which
CUDA graphs remove; the weights of the released talker take about 0.15 ms to read on an H200. A
step is timed as the difference of two ``generate`` calls that decode N1 and N2 steps per row
(rows run exactly that long: stop ids blocked below N, max length N), so prefill, engine setup and
the graph captures (one shape: ``kv_bucket=None``, fixed capacity; the same captures in both
calls) cancel out. Tokens of the two modes are compared too, first (row, step) where they part:
at the same batch shape the replayed graph runs the eager step's kernels, so they must be equal.
Row 0 is the same request at every batch size; where its tokens at batch N part from batch 1's is
printed too, as information (other shapes run other kernels: only rounding is promised there).

Subcommands::

    python -m benchmarks.gpu_step env [--require-cuda]                 # GPU, memory, torch, CUDA
    python -m benchmarks.gpu_step steps [--tiny] [--device cuda] [--dtype auto] [--batches 1,64,sized]
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
import time
from pathlib import Path
from typing import Any, cast

import torch

from benchmarks.gpu_verdict import decode_verdict, token_difference
from cosyclone.options import CudaGraphs

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


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


#: The environment variables that change what the check measures or may reach, shown in the env log.
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
            "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS")


def no_cuda_reason() -> str:
    """Why torch reaches no CUDA device, in the driver's own words where torch has them."""
    if not torch.version.cuda and not getattr(torch.version, "hip", None):
        return f"torch {torch.__version__} is a CPU build (no CUDA in it)"
    where = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    try:
        torch.cuda.init()
    except Exception as exc:  # the driver's message: no driver, too old, no device
        return f"{where} finds no usable GPU{hint}: {str(exc).splitlines()[0][:200]}"
    return f"{where} sees {torch.cuda.device_count()} devices but is_available() is false{hint}"


def require_device(name: str) -> torch.device:
    """The device asked for, or a clear exit within seconds: the check never measures the CPU in a
    GPU's place (its figures would carry a GPU's label and a CPU's speed)."""
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = f"--device {name}: {no_cuda_reason()}; the check never falls back to the CPU"
        print(f"SUMMARY: {why}", flush=True)
        raise SystemExit(3)
    return dev


def env(args: argparse.Namespace) -> None:
    """What the figures were measured on: GPU (name, total and free memory), torch, CUDA, cuDNN,
    the variables that shape the run, and the precision synth would take. ``--require-cuda``
    (every run but the dry run): no CUDA device is a failure (exit 3), said in the summary."""
    import platform

    from benchmarks.machine import cpu_name

    fig: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "env": {k: os.environ.get(k) for k in ENV_VARS},
    }
    problem = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        fig.update(
            gpu=torch.cuda.get_device_name(0),
            gpus=torch.cuda.device_count(),
            gpu_memory_gib=_gib(total),
            gpu_free_gib=_gib(free),
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            bf16=torch.cuda.is_bf16_supported(),
        )
    else:
        problem = no_cuda_reason()
        fig["no_cuda"] = problem
    for k, v in fig.items():
        print(f"  {k}: {v}")
    from cosyclone.base.device import resolve

    policy = resolve("auto", "auto", "auto")
    fig.update(run_device=str(policy.device), run_dtype=policy.dtype_name)
    where = (f"{fig['gpu']}, {fig['gpu_memory_gib']:.1f} GiB ({fig['gpu_free_gib']:.1f} free)" if "gpu" in fig
             else "no GPU (CPU only)")
    line = (f"{where}; torch {torch.__version__}, CUDA {torch.version.cuda}; synth would run "
            f"{policy.dtype_name} on {policy.device}")
    if problem and args.require_cuda:
        emit("env", fig, f"NO CUDA: {problem}")
        raise SystemExit(3)
    emit("env", fig, line)


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
    from cosyclone.talker import TalkerRequest

    g = torch.Generator().manual_seed(0)
    vocab, speech = model.cfg.qwen.vocab_size, model.cfg.speech_token_size
    return [
        TalkerRequest(
            row_id=f"r{i}",
            text_ids=torch.randint(0, vocab, (text_len,), generator=g),
            target_len=4,
            prompt_speech_tokens=torch.randint(0, speech, (speech_len,), generator=g),
            seed=i,
        )
        for i in range(batch)
    ]


def _timed(model: Any, reqs: list[Any], steps: int, capacity: int, graphs: str,
           backend: Any, reps: int = 2) -> tuple[float, list, bool]:
    """The best of ``reps`` decodes of ``steps`` steps per row: seconds, each row's tokens, and
    whether any step replayed a graph (what ran, not what was asked)."""
    from cosyclone.talker import DecodeOptions, generate
    from cosyclone.talker.graph_pool import PROCESS
    from cosyclone.talker.graphs import GraphChoice, resolve_cuda_graphs
    from cosyclone.talker.request import StepMechanics

    opts = DecodeOptions(max_len_override=steps, min_len_override=steps, cuda_graphs=cast(CudaGraphs, graphs),
                         mechanics=StepMechanics(kv_bucket=None, capacity=capacity))
    best, res = float("inf"), []
    saved = PROCESS.capture, PROCESS.capture_anywhere
    if backend is not None:  # the CPU rehearsal: the process captures with a stand-in on any device
        PROCESS.capture, PROCESS.capture_anywhere = (lambda device: backend), True
    try:
        for _ in range(reps):
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            t0 = time.perf_counter()
            res = generate(model, reqs, opts)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            best = min(best, time.perf_counter() - t0)
        choice = resolve_cuda_graphs(graphs, model.device, anywhere=PROCESS.capture_anywhere)
    finally:
        PROCESS.capture, PROCESS.capture_anywhere = saved
    if PROCESS.disabled is not None:  # a capture failed: the decode went on eagerly
        choice = GraphChoice(False, PROCESS.disabled)
    if graphs == "auto" and not choice.enabled:
        print(f"    note: graphs off: {choice.reason}", flush=True)
    used = any(getattr(r.diagnostics, "graph_steps", 0) for r in res)  # what ran, not what was asked
    return best, [r.raw_tokens for r in res], used


def batch_sizes(spec: str, policy: Any) -> tuple[list[int], int | None]:
    """The batches of ``--batches`` ("1,64,sized"), ``sized`` being the talker slots a run on this
    device would be sized for (the free memory now less every model's weights, as ``--dry-run``
    plans; CPU: its batch size), each batch once; and that sized count (None when not asked)."""
    sized = None
    out: list[int] = []
    for word in spec.split(","):
        if word.strip() == "sized":
            from cosyclone.engine.sizing import dry_run_sizing
            from cosyclone.model.config import released_config
            from cosyclone.options import RunOptions

            plan = dry_run_sizing(released_config(), policy, RunOptions())
            sized = plan.talker_slots or plan.batch_size
            b = sized
        else:
            b = int(word)
        if b not in out:
            out.append(b)
    return out, sized


def steps(args: argparse.Namespace) -> dict[str, Any]:
    """ms per decode step at each batch, eager and graphed, on one model; peak memory per batch."""
    from cosyclone.base.device import resolve
    from cosyclone.talker.graphs import EagerCapture

    device = require_device(args.device)
    policy = resolve(device.type, args.dtype)  # auto: what synth runs (mixed: an fp32 talker)
    dtype = policy.dtype  # the talker backbone's
    batches, sized = batch_sizes(args.batches, policy)
    tiny = bool(args.tiny)
    model = _model(tiny, device, dtype)
    n1, n2 = (4, 16) if tiny else (16, 80)
    text_len, speech_len = (6, 4) if tiny else (PROMPT_TEXT, PROMPT_SPEECH)
    capacity = text_len + speech_len + 2 + n2
    backend = None if device.type == "cuda" else EagerCapture()  # CPU: the wrapper, structurally
    where = (f"{device_name(device)} ({device.type}, {policy.dtype_name}: talker {dtype_name(dtype)}, "
             f"{'tiny' if tiny else 'full-size dummy'} weights)")
    print(f"decode step: ms per step, {n2 - n1} steps measured (difference of {n2}- and {n1}-step decodes), "
          f"KV capacity {capacity}, on {where}", flush=True)
    out: dict[str, Any] = {"device": where, "dtype": policy.dtype_name, "talker_dtype": dtype_name(dtype),
                           "sized_slots": sized, "ms_per_step": {}}
    cells = []
    # row 0's eager tokens at the first batch (the same request in every batch)
    first: list[int] | None = None
    with torch.inference_mode():
        for b in batches:
            reqs = _requests(model, b, text_len, speech_len)
            row: dict[str, Any] = {}
            toks: dict[str, list] = {}
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for mode in ("off", "auto"):
                # warm-up (kernels, allocator, cuBLAS)
                _timed(model, reqs, n1, capacity, mode, backend, reps=1)
                t1, _, _ = _timed(model, reqs, n1, capacity, mode, backend)
                t2, toks[mode], used = _timed(model, reqs, n2, capacity, mode, backend)
                row["eager" if mode == "off" else "graphs"] = 1e3 * (t2 - t1) / (n2 - n1)
                if mode == "auto":
                    row["graphs_used"] = used
            # tokens first: the same shape, the same kernels
            diff = token_difference(toks["off"], toks["auto"])
            row["tokens_equal"] = diff is None
            if diff:
                row["token_difference"] = f"eager vs graphs: {diff}"
            if first is None:
                first = toks["off"][0]
            else:  # information only: another batch shape runs other kernels
                row["row0_vs_first_batch"] = token_difference([first], [toks["off"][0]]) or "equal"
            if device.type == "cuda":
                row["peak_allocated_gib"] = _gib(torch.cuda.max_memory_allocated(device))
                row["peak_reserved_gib"] = _gib(torch.cuda.max_memory_reserved(device))
            out["ms_per_step"][b] = row
            mem = (
                f", peak {row['peak_allocated_gib']:.2f} GiB allocated / "
                f"{row['peak_reserved_gib']:.2f} reserved"
                if "peak_allocated_gib" in row
                else ""
            )
            ratio = f"{row['eager'] / row['graphs']:5.2f}x" if min(row["eager"], row["graphs"]) > 0 else "n/a"
            print(
                f"  batch {b:3d}: eager {row['eager']:8.3f} ms/step, graphs {row['graphs']:8.3f} ms/step "
                f"({ratio}), graphs used: {row['graphs_used']}, "
                f"tokens equal: {row['tokens_equal'] or row['token_difference']}{mem}"
                + (
                    f"; row 0 vs its first batch: {row['row0_vs_first_batch']}"
                    if "row0_vs_first_batch" in row
                    else ""
                )
                + (
                    "  [CPU: graphs = EagerCapture stand-in, not a speed figure]"
                    if backend is not None
                    else ""
                ),
                flush=True,
            )
            cells.append(f"b{b} {row['eager']:.2f}/{row['graphs']:.2f}"
                         + (f" ({row['peak_allocated_gib']:.1f}G)" if "peak_allocated_gib" in row else ""))
    ok, why = decode_verdict(out, require_graphs=True)
    emit("decode", out, f"talker {dtype_name(dtype)} ms/step eager/graphs: {', '.join(cells)}"
                        + (f" (sized: {sized} slots)" if sized else "") + "; "
                        + ("tokens equal, graphs replayed" if ok else why))
    if not ok:
        raise SystemExit(f"decode: {why}")
    return out


def _rows(n: int) -> list[dict[str, str]]:
    """``n`` rows of mixed lengths over the three bundled prompts (paths relative to manifests/)."""
    words = [
        "the",
        "quiet",
        "harbour",
        "wakes",
        "as",
        "boats",
        "return",
        "with",
        "the",
        "morning",
        "light",
        "and",
        "gulls",
        "circle",
        "over",
        "the",
        "market",
        "stalls",
        "where",
        "fishermen",
        "call",
        "out",
        "the",
        "prices",
        "of",
        "the",
        "day",
    ]
    return [{"id": f"row{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
             "prompt_text": "This is the reference speaker talking.",
             "text": " ".join(words[: 6 + (i * 5) % (len(words) - 6)]).capitalize() + "."} for i in range(n)]


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
    print(
        f"RTF {wall / audio if audio > 0 else float('nan'):.4f} ({audio:.2f} audio s in {wall:.2f} wall s, "
        f"{run['done']} rows done, {run['failed']} failed; device {run.get('device')}, "
        f"dtype {run.get('dtype')}, "
        f"cuda_graphs {opts.get('cuda_graphs')})"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env")
    p.add_argument("--require-cuda", action="store_true", help="no CUDA device is a failure (exit 3)")
    p = sub.add_parser("steps")
    p.add_argument("--tiny", action="store_true", help="tiny geometry, few steps (CPU-sized check)")
    p.add_argument(
        "--device", default="cuda", help="cuda (default; none reachable: exit 3, never the CPU) | cpu"
    )
    p.add_argument("--dtype", default="auto", choices=("auto", "mixed", "bf16", "fp32"),
                   help="auto (default): the precision synth takes (on a bf16 GPU mixed: the talker in fp32)")
    p.add_argument("--batches", default="1,64,sized",
                   help="slot counts; sized: the talker slots a run on this device is sized for")
    p = sub.add_parser("manifest")
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=16)
    p = sub.add_parser("rtf")
    p.add_argument("folder")
    args = ap.parse_args(argv)
    _deadline()
    {"env": env, "steps": steps, "manifest": manifest, "rtf": rtf}[args.cmd](args)


if __name__ == "__main__":
    main()
