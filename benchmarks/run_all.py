"""``make bench``: the stage benchmarks (when present) plus the end-to-end figure.

End to end: a 16-row manifest through the real CLI on full-size dummy weights (released geometry,
random values), reported as audio seconds per wall second against the official per-request
figure on this machine (BASELINE_CPU.md: 4.0 s of audio in 24.95 s, batch 1).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL_AUDIO_S, OFFICIAL_WALL_S = 4.0, 24.95
E2E_ROWS = int(os.environ.get("COSYCLONE_BENCH_ROWS", "16"))
E2E_MAX_TOKENS = int(os.environ.get("COSYCLONE_BENCH_MAX_TOKENS", "25"))


def run_stage_benchmarks() -> None:
    for name in ("bench_talker", "bench_sampler", "bench_code2wav"):
        if not (ROOT / "benchmarks" / f"{name}.py").is_file():
            print(f"[{name}] not present, skipped")
            continue
        print(f"[{name}]")
        importlib.import_module(f"benchmarks.{name}").main()


def end_to_end() -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-bench-"))
    try:
        shutil.copytree(ROOT / "manifests" / "prompts", tmp / "prompts")
        words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
        rows = [{"id": f"b{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
                 "prompt_text": "this is the reference speaker", "text": " ".join(words[: 4 + i % 6])}
                for i in range(E2E_ROWS)]
        (tmp / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        cmd = [sys.executable, "-m", "cosyclone.cli", "synth", str(tmp / "m.jsonl"), "--load-format", "dummy",
               "--out", str(tmp / "out"), "--max-tokens", str(E2E_MAX_TOKENS), "--batch-size", "16",
               "--overwrite"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 3):
            print(proc.stdout, proc.stderr)
            raise SystemExit(f"end-to-end run failed with exit code {proc.returncode}")
        summary = json.loads((tmp / "out" / "summary.json").read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    audio = float(summary["audio_seconds"])
    ours = audio / summary["wall_seconds"]
    official = OFFICIAL_AUDIO_S / OFFICIAL_WALL_S
    return {"rows": E2E_ROWS, "max_tokens": E2E_MAX_TOKENS, "audio_s": audio,
            "model_wall_s": summary["wall_seconds"], "process_wall_s": wall,
            "audio_s_per_wall_s": ours, "official_audio_s_per_wall_s": official, "ratio_vs_official": ours / official}


def main() -> None:
    run_stage_benchmarks()
    fig = end_to_end()
    print(f"[end-to-end] {fig['rows']} rows, <= {fig['max_tokens']} tokens/row, full-size dummy weights: "
          f"{fig['audio_s']:.1f} s audio in {fig['model_wall_s']:.1f} s -> {fig['audio_s_per_wall_s']:.3f} "
          f"audio s per wall s vs official {fig['official_audio_s_per_wall_s']:.3f} "
          f"(ratio {fig['ratio_vs_official']:.2f}x; process incl. load {fig['process_wall_s']:.1f} s)")


if __name__ == "__main__":
    main()
