"""What one ``--engine ray`` actor holds in memory: the measurement behind
``cosyclone/ray/footprint.py``'s constants.

Usage: ``python -m benchmarks.actor_footprint [--cases dummy-fp32,dummy-bf16,dir-fp32,dir-bf16,onnx]
[--rows 8] [--tokens 100] [--threads 2]``.

Each case runs in a fresh subprocess (so no case inherits another's pages or allocator state) that
imports ``ray.data`` first, as an actor's worker process has, then loads the stages with
:func:`cosyclone.engine.stages.load_stages` on the released geometry and runs one batch of ``--rows`` rows
(the default batch size) of exactly ``--tokens`` speech tokens with one Euler step of the flow (the
flow's peak is per step: more steps take longer, not more memory). Read at three points (start,
after load, after the first batch) from ``/proc/self/smaps_rollup`` and ``/proc/self/status``: RSS,
the peak RSS (``VmHWM``), PSS, private and shared pages, anonymous pages, and how much of the model
directory's files is still mapped.

Cases: ``dummy-*`` are ``--load-format dummy`` (random weights drawn in the process: anonymous,
private memory); ``dir-*`` read a full-size model directory in the released layout (random weights,
written by :func:`cosyclone.engine.tiny.make_tiny_model` at the released sizes into a temp folder, about
5.5 GB with the Qwen safetensors copy, deleted at the end) through the real loader
(``torch.load(mmap=True)``), which is what tells whether weights stay memory-mapped (shared through
the page cache by the actors of a node) or are copied. ``onnx`` measures onnxruntime's resident bytes
per byte of ONNX file on a synthetic 256 MiB-initializer graph (the released speech tokenizer is
hundreds of MB; the directory written here carries the tiny ONNX models).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
CASES = ("dummy-fp32", "dummy-bf16", "dir-fp32", "dir-bf16", "onnx")
ROLLUP = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Shared_Clean", "Shared_Dirty", "Private_Clean",
          "Private_Dirty", "Anonymous")
MIB = 1 << 20


def memory(model_dir: Path | None = None) -> dict[str, int]:
    """This process's memory now, in bytes: the smaps_rollup fields, VmRSS/VmHWM and the model files
    mapped."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if key in ROLLUP:
            out[key] = int(rest.split()[0]) * 1024
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    out["model_files_rss"] = _mapped(model_dir) if model_dir is not None else 0
    return out


def _mapped(model_dir: Path) -> int:
    """Resident bytes of mappings of files under ``model_dir`` (memory-mapped weights still in use)."""
    total, inside = 0, False
    prefix = str(model_dir.resolve())
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
            inside = len(head) >= 6 and head[5].startswith(prefix)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def _released_sizes() -> Any:
    from cosyclone.engine.tiny import TinySizes
    from cosyclone.model.config import released_config

    c = released_config()
    q, f, h = c.talker.qwen, c.flow, c.hift
    return TinySizes(
        llm_hidden=q.hidden_size,
        llm_layers=q.num_hidden_layers,
        llm_heads=q.num_attention_heads,
        llm_kv_heads=q.num_key_value_heads,
        llm_intermediate=q.intermediate_size,
        pre_lookahead_channels=f.pre_lookahead_channels,
        dit_dim=f.dit.dim,
        dit_depth=f.dit.depth,
        dit_heads=f.dit.heads,
        dit_dim_head=f.dit.dim_head,
        hift_base_channels=h.base_channels,
        f0_cond_channels=h.f0_cond_channels,
    )


def write_full_size_dir(root: Path) -> Path:
    """A model directory in the released layout at the released sizes (random weights)."""
    from cosyclone.engine.tiny import make_tiny_model
    from cosyclone.model.config import load_model_config, released_config

    make_tiny_model(root, _released_sizes())
    got, want = load_model_config(root), released_config()
    assert (got.talker, got.flow, got.hift) == (want.talker, want.flow, want.hift), (
        "not the released geometry"
    )
    return root


def _rows(folder: Path, n: int) -> list[Any]:
    from cosyclone.manifest import read_manifest

    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts", dirs_exist_ok=True)
    text = "the quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire all day long"
    rows = [{"id": f"f{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
             "prompt_text": "reference words for the speaker", "text": text} for i in range(n)]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_manifest(folder / "m.jsonl").rows


def child(case: str, model_dir: Path | None, rows: int, tokens: int, threads: int) -> dict[str, Any]:
    """One case, in this (fresh) process: the figures as a dict."""
    import ray.data  # noqa: F401 - an actor's worker process has Ray and Ray Data imported
    import torch

    torch.set_num_threads(threads)
    if case == "onnx":
        assert model_dir is not None
        return _onnx_case(model_dir)
    from cosyclone.base.device import resolve
    from cosyclone.engine import Engine
    from cosyclone.engine.stages import load_stages
    from cosyclone.frontend.tiny_assets import builtin_assets_dir
    from cosyclone.model.config import load_model_config, released_config
    from cosyclone.options import DtypeName, LoadFormat, RunOptions
    from cosyclone.ray.footprint import weight_bytes

    kind, dtype_word = case.split("-")
    dtype = cast(DtypeName, dtype_word)
    policy = resolve("cpu", dtype)
    load_format: LoadFormat
    if kind == "dir":
        assert model_dir is not None
        cfg, load_format = load_model_config(model_dir), "auto"
    else:
        from dataclasses import replace

        cfg, load_format = replace(released_config(), model_dir=builtin_assets_dir()), "dummy"
    start = memory(model_dir)
    t0 = time.perf_counter()
    stages = load_stages(cfg, policy, load_format)
    load_s = time.perf_counter() - t0
    loaded = memory(model_dir)
    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-footprint-"))
    try:
        opts = RunOptions(batch_size=rows, max_tokens=tokens, min_tokens=tokens, n_timesteps=1, dtype=dtype,
                          cpu_gemm="auto", load_format=load_format)
        t0 = time.perf_counter()
        recs = list(Engine(stages, opts).run(_rows(tmp, rows), prefetch=False))
        batch_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ok = sum(1 for r in recs if r.ok)
    return {"case": case, "start": start, "loaded": loaded, "batch": memory(model_dir), "load_s": load_s,
            "batch_s": batch_s, "rows_ok": ok, "weights": weight_bytes(cfg, policy)}


def write_big_onnx(path: Path) -> Path:
    """One MatMul with a 256 MiB fp32 initializer (written by the parent: its making must not count)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = ONNX_N
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


ONNX_N = 8192  # 8192 x 8192 fp32 = 256 MiB


def _onnx_case(path: Path) -> dict[str, Any]:
    """onnxruntime's resident bytes per ONNX file byte: the session of ``path``, then one run."""
    import numpy as np

    from cosyclone.frontend.onnx import get_session

    before = memory()
    sess: Any = get_session(path, ["CPUExecutionProvider"])
    loaded = memory()
    sess.run(None, {"x": np.ones((1, ONNX_N), np.float32)})
    return {
        "case": "onnx",
        "file_bytes": path.stat().st_size,
        "start": before,
        "loaded": loaded,
        "batch": memory(),
    }


def _run_child(case: str, model_dir: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.actor_footprint", "--child", case, "--rows", str(args.rows),
           "--tokens", str(args.tokens), "--threads", str(args.threads)]
    if model_dir is not None:
        cmd += ["--model-dir", str(model_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _g(x: float) -> str:
    return f"{x / (1 << 30):.2f}"


def render(fig: dict[str, Any]) -> list[str]:
    """Printed lines of one case (GiB)."""
    if fig["case"] == "onnx":
        grew = fig["loaded"]["VmRSS"] - fig["start"]["VmRSS"]
        ran = fig["batch"]["VmHWM"] - fig["start"]["VmRSS"]
        return [
            f"[footprint] onnx: {fig['file_bytes'] / MIB:.0f} MiB file -> RSS +{grew / MIB:.0f} MiB after "
            f"the session ({grew / fig['file_bytes']:.2f}x the file), peak +{ran / MIB:.0f} MiB after a run "
            f"({ran / fig['file_bytes']:.2f}x)"
        ]
    out = [f"[footprint] {fig['case']}: weights {_g(fig['weights'])} GiB (parameters and buffers); load "
           f"{fig['load_s']:.0f} s, first batch {fig['batch_s']:.0f} s ({fig['rows_ok']} rows ok)"]
    for point in ("start", "loaded", "batch"):
        m = fig[point]
        out.append(
            f"[footprint]   {point:>6}: RSS {_g(m['VmRSS'])} peak {_g(m['VmHWM'])} PSS {_g(m['Pss'])} "
            f"anon {_g(m['Anonymous'])} private {_g(m['Private_Clean'] + m['Private_Dirty'])} shared "
            f"{_g(m['Shared_Clean'] + m['Shared_Dirty'])} model files mapped {_g(m['model_files_rss'])} GiB"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--rows", type=int, default=8, help="rows of the first batch (the default --batch-size)")
    p.add_argument("--tokens", type=int, default=100, help="speech tokens per row (min = max)")
    p.add_argument(
        "--threads", type=int, default=2, help="torch threads of each case (memory barely depends on it)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.model_dir, args.rows, args.tokens, args.threads)))
        return
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")
    print(
        f"[footprint] {cpu_name()}, {os.cpu_count()} CPUs; released geometry, {args.rows} rows x "
        f"{args.tokens} tokens, 1 Euler step, {args.threads} torch threads; one fresh process per case",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-footprint-dir-"))
    figs = []
    try:
        model_dir = write_full_size_dir(tmp / "model") if any(c.startswith("dir-") for c in cases) else None
        for case in cases:
            where = model_dir if case.startswith("dir-") else None
            if case == "onnx":
                where = write_big_onnx(tmp / "big.onnx")
            fig = _run_child(case, where, args)
            figs.append(fig)
            print("\n".join(render(fig)), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figs, indent=1))


if __name__ == "__main__":
    main()
