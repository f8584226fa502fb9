"""``make bench``: the stage benchmarks (when present) plus the end-to-end figure.

End to end: a 16-row manifest through the real CLI (a subprocess, one batch) on full-size dummy
weights (released geometry, random values), shaped like BASELINE_CPU.md's request so that the
figure compares like for like with the official per-request one (4.0 s of audio in 24.95 s,
batch 1): every row generates exactly ``COSYCLONE_BENCH_TOKENS`` speech tokens (``--min-tokens`` =
``--max-tokens``, as the baseline masked the stop ids to get exactly 100), with a 3.0 s prompt
(75 prompt speech tokens), a prompt text of 20 ids ending in ``<|endofprompt|>`` and a target
text of 30 ids (measured with the run's own tokenizer), 10 Euler steps. Reported: audio seconds
per wall second of the three stages (what the baseline timed) and of the whole model run
(frontend included), the per-stage seconds summed from ``diagnostics.jsonl``, and each stage's
rows per second on the same rows (the frontend's per prompt worker and for the run's workers: it
must outpace the talker and code2wav, or it bounds the GPU).

Environment (all optional):

* ``COSYCLONE_BENCH_MANIFEST_ROWS`` rows of bench_manifest's ``synth --dry-run`` (2000);
* ``COSYCLONE_BENCH_FIRST_ROW_ROWS`` rows of its time-to-first-WAV comparison, streamed vs read whole (6000; 0
skips);
* ``COSYCLONE_BENCH_EXPORT_ROWS`` run-folder sizes of bench_export's peak-memory comparison ("2000,20000");
* ``COSYCLONE_BENCH_REPORT_ROWS`` rows of bench_report_html's folder, whose ``report --html`` is timed
(100000);
* ``COSYCLONE_BENCH_FOLDER_RECORDS`` records of bench_folder's synthetic folder (1000000: 4-row synth, report
  and resume plan against it);
* ``COSYCLONE_BENCH_HOST_ROWS`` rows of bench_host's zero-cost night (100000);
  ``COSYCLONE_BENCH_HOST_H100_ROWS`` rows of its run with stages timed like an H100 (1000);
* ``COSYCLONE_BENCH_ROWS`` rows (16); ``COSYCLONE_BENCH_BATCH`` rows per batch (= rows);
* ``COSYCLONE_BENCH_TOKENS`` speech tokens per row (100);
* ``COSYCLONE_BENCH_DTYPE`` ``--dtype`` (fp32, as the baseline); ``COSYCLONE_BENCH_DEVICE`` (auto);
* ``COSYCLONE_BENCH_MODEL_DIR`` a model directory (e.g. from ``cosyclone make-tiny-model``) read
  with ``--model-dir`` instead of ``--load-format dummy``;
* ``COSYCLONE_BENCH_N_TIMESTEPS`` flow Euler steps (unset: the model's, 10);
* ``COSYCLONE_BENCH_CPU_GEMM`` ``--cpu-gemm`` (auto: oneDNN's linear layers on CPU where torch has it);
* ``COSYCLONE_BENCH_E2E_ALSO`` comma-separated further ``--dtype`` values to run the same end-to-end
  workload in after the first (default ``bf16`` on CPUs with native bf16, AMX or AVX512-BF16, else none;
  empty: only ``COSYCLONE_BENCH_DTYPE``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL_AUDIO_S, OFFICIAL_WALL_S = 4.0, 24.95
OFFICIAL_STAGE_S = {"talker": 10.96, "flow": 13.22, "hift": 0.76}  # per request, BASELINE_CPU.md
BASELINE_PROMPT_IDS, BASELINE_TEXT_IDS, BASELINE_PROMPT_S = 20, 30, 3.0
ENDOFPROMPT = "<|endofprompt|>"
PROMPT_WORDS = "this is the reference speaker talking to you about the weather and the sea and the sky today"
TEXTS = ("the quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire all day long",
         "tomorrow will be sunny with a light breeze from the west and a few clouds in the late afternoon",
         "please read this sentence slowly and calmly so that everyone in the room can follow every word",
         "we walked along the quiet river bank and watched the boats drift past under the old stone bridge")


@dataclass(frozen=True)
class E2EConfig:
    """What the end-to-end run looks like (see the module docstring for the environment names)."""

    rows: int = 16  # manifest rows
    tokens: int = 100  # speech tokens every row generates (min = max)
    batch_size: int = 16  # rows per batch
    dtype: str = "fp32"  # --dtype
    device: str = "auto"  # --device
    model_dir: Path | None = None  # --model-dir; None = --load-format dummy (released size)
    n_timesteps: int | None = None  # --n-timesteps; None = the model's (10)
    cpu_gemm: str = "auto"  # --cpu-gemm (the library of the fp32 linear layers on CPU)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> E2EConfig:
        env = dict(os.environ if env is None else env)
        rows = int(env.get("COSYCLONE_BENCH_ROWS", "16"))
        steps = env.get("COSYCLONE_BENCH_N_TIMESTEPS")
        model_dir = env.get("COSYCLONE_BENCH_MODEL_DIR")
        return cls(
            rows=rows,
            tokens=int(env.get("COSYCLONE_BENCH_TOKENS", "100")),
            batch_size=int(env.get("COSYCLONE_BENCH_BATCH", str(rows))),
            dtype=env.get("COSYCLONE_BENCH_DTYPE", "fp32"),
            device=env.get("COSYCLONE_BENCH_DEVICE", "auto"),
            model_dir=Path(model_dir) if model_dir else None,
            n_timesteps=int(steps) if steps else None,
            cpu_gemm=env.get("COSYCLONE_BENCH_CPU_GEMM", "auto"),
        )


#: The stage benchmarks ``make bench`` runs, in order, before the end-to-end figure (docs/benchmarks.md
#: lists them).
STAGE_BENCHMARKS = (
    "bench_projection",
    "bench_talker",
    "bench_sampler",
    "bench_code2wav",
    "bench_flow_gemm",
    "bench_dtype_agreement",
    "bench_text",
    "bench_manifest",
    "bench_export",
    "bench_folder",
    "bench_report_html",
    "bench_ray",
    "bench_host",
)


def run_stage_benchmarks() -> None:
    for name in STAGE_BENCHMARKS:
        if not (ROOT / "benchmarks" / f"{name}.py").is_file():
            print(f"[{name}] not present, skipped")
            continue
        if name == "bench_ray" and importlib.util.find_spec("ray") is None:
            print(f"[{name}] ray not installed (pip install -e '.[ray]'), skipped")
            continue
        print(f"[{name}]")
        module = importlib.import_module(f"benchmarks.{name}")
        if name == "bench_host":  # the host's ceiling over a night of zero-cost stages, then card-timed rows
            module.main([])
            module.main(["--costs", "h100", "--rows",
                         os.environ.get("COSYCLONE_BENCH_HOST_H100_ROWS", "1000")])
        else:
            module.main()


def _frontend(cfg: E2EConfig):
    """The frontend the run will use (the model directory's, or the dummy run's built-in assets)."""
    from cosyclone.frontend import Frontend
    from cosyclone.frontend.tiny_assets import builtin_assets_dir
    from cosyclone.model.config import load_model_config, released_config

    if cfg.model_dir is not None:
        return Frontend(load_model_config(cfg.model_dir))
    return Frontend(replace(released_config(), model_dir=builtin_assets_dir()))


def _fit(count, base: str, n: int, suffix: str = "") -> tuple[str, int]:
    """The longest prefix of ``base`` (+ ``suffix``) whose id count is <= n, and that count."""
    best = (base[:1] + suffix, count(base[:1] + suffix))
    for end in range(1, len(base) + 1):
        cand = base[:end].rstrip() + suffix
        k = count(cand)
        if k > n:
            break
        best = (cand, k)
    return best


def build_manifest(cfg: E2EConfig, folder: Path) -> dict:
    """Write ``folder/m.jsonl`` and its 3.0 s prompts; return the measured shapes of a row."""
    import numpy as np
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    for k in (1, 2, 3):  # the example speakers, cut or padded with silence to exactly 3.0 s
        wav, sr = sf.read(str(ROOT / "manifests" / "prompts" / f"speaker{k}.wav"), dtype="float32")
        n = int(round(BASELINE_PROMPT_S * sr))
        sf.write(
            str(folder / f"prompt{k}.wav"), np.pad(wav, (0, max(0, n - len(wav))))[:n], sr, subtype="PCM_16"
        )
    fe = _frontend(cfg)

    def prompt_ids(text: str) -> int:
        return len(fe.text.build_text("zero_shot", text, "x")[0])

    def text_ids(text: str) -> int:
        return sum(len(s) for s in fe.text.build_text("zero_shot", "x" + ENDOFPROMPT, text)[1])

    prompt_text, n_prompt = _fit(prompt_ids, PROMPT_WORDS, BASELINE_PROMPT_IDS, ENDOFPROMPT)
    texts = [_fit(text_ids, t, BASELINE_TEXT_IDS) for t in TEXTS]
    rows = [{"id": f"b{i:02d}", "prompt_audio": f"prompt{i % 3 + 1}.wav", "prompt_text": prompt_text,
             "text": texts[i % len(texts)][0]} for i in range(cfg.rows)]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompt_tokens = sorted({int(fe.prompt_features(folder / f"prompt{k}.wav")["speech_token"].numel())
                            for k in (1, 2, 3)})
    return {"prompt_ids": n_prompt, "text_ids": sorted({k for _, k in texts}), "prompt_tokens": prompt_tokens,
            "prompt_seconds": BASELINE_PROMPT_S, "distinct_prompts": len({r["prompt_audio"] for r in rows})}


def synth_args(cfg: E2EConfig, manifest: Path, out: Path) -> list[str]:
    """``cosyclone`` arguments of the end-to-end run."""
    args = [
        "synth",
        str(manifest),
        "--out",
        str(out),
        "--max-tokens",
        str(cfg.tokens),
        "--min-tokens",
        str(cfg.tokens),
        "--batch-size",
        str(cfg.batch_size),
        "--dtype",
        cfg.dtype,
        "--device",
        cfg.device,
        "--cpu-gemm",
        cfg.cpu_gemm,
        "--overwrite",
    ]
    args += ["--model-dir", str(cfg.model_dir)] if cfg.model_dir is not None else ["--load-format", "dummy"]
    if cfg.n_timesteps is not None:
        args += ["--n-timesteps", str(cfg.n_timesteps)]
    return args


def summarize(cfg: E2EConfig, out: Path) -> dict:
    """The figures of a finished run from ``summary.json`` and ``diagnostics.jsonl``."""
    from cosyclone.folder.current import current_records

    summary = json.loads((out / "summary.json").read_text())
    lines = list(current_records(out).values())
    ok = [d for d in lines if d.ok]
    stages = {
        k: sum(float(d.seconds.get(k, 0.0)) for d in lines) for k in ("frontend", "talker", "flow", "hift")
    }
    tokens = [sum(d.tokens) for d in ok]
    steps = [sum(s.steps for s in d.sampler) for d in ok]
    audio = float(summary["audio_seconds"])
    run = summary["last_run"]  # the invocation's own figures (the top level totals the folder)
    model_wall = float(run["wall_seconds"])
    stage_wall = stages["talker"] + stages["flow"] + stages["hift"]
    official = OFFICIAL_AUDIO_S / OFFICIAL_WALL_S
    ours = audio / stage_wall if stage_wall > 0 else 0.0
    return {
        "rows": cfg.rows,
        "rows_ok": len(ok),
        "tokens_requested": cfg.tokens,
        "tokens_per_row": (min(tokens), max(tokens)) if tokens else (0, 0),
        "sampled_per_row": (min(steps), max(steps)) if steps else (0, 0),
        "audio_s": audio,
        "model_wall_s": model_wall,
        "stage_s": stages,
        "stage_wall_s": stage_wall,
        "audio_s_per_wall_s": ours,
        "audio_s_per_model_wall_s": audio / model_wall if model_wall > 0 else 0.0,
        "official_audio_s_per_wall_s": official,
        "ratio_vs_official": ours / official,
        "device": run.get("device"),
        "dtype": run.get("dtype"),
        "batch_size": cfg.batch_size,
        "load_format": "full-size dummy" if cfg.model_dir is None else str(cfg.model_dir),
        "n_timesteps": run.get("options", {}).get("n_timesteps"),
        "cpu_gemm": run.get("options", {}).get("cpu_gemm"),
        "frontend_workers": _frontend_workers(run),
        "rates": stage_rates(len(lines), stages),
    }


def stage_rates(rows: int, stages: dict) -> dict:
    """Rows per second of each stage on the same rows, from the stage seconds summed over them: the
    frontend's per prompt worker (its seconds are the workers' compute, charged to the rows),
    the talker's and code2wav's (flow + HiFT) as the run shares them out."""
    def rate(seconds: float) -> float:
        return rows / seconds if seconds > 0 else float("inf")

    return {"frontend_per_worker": rate(stages["frontend"]), "talker": rate(stages["talker"]),
            "code2wav": rate(stages["flow"] + stages["hift"])}


def _frontend_workers(run: dict) -> int:
    """The run's prompt workers: as its record names them, else by the engine's rule for this machine."""
    facts = run.get("engine_facts")  # EngineFacts.as_record(), where the run records it
    given = ((facts.get("sizing") or {}) if isinstance(facts, dict) else {}).get("frontend_workers")
    if given:
        return int(given)
    from cosyclone.engine.sizing import frontend_plan
    from cosyclone.options import RunOptions

    opts = run.get("options", {})
    workers, _ = frontend_plan(
        RunOptions(
            threads=opts.get("threads"),
            frontend_workers=opts.get("frontend_workers"),
            frontend_threads=opts.get("frontend_threads"),
        ),
        gpu=str(run.get("device", "cpu")).split(":")[0] != "cpu",
    )
    return workers


def end_to_end(cfg: E2EConfig | None = None) -> dict:
    cfg = cfg or E2EConfig.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-bench-"))
    try:
        shape = build_manifest(cfg, tmp)
        cmd = [sys.executable, "-m", "cosyclone.cli", *synth_args(cfg, tmp / "m.jsonl", tmp / "out")]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode not in (0, 3):
            print(proc.stdout, proc.stderr)
            raise SystemExit(f"end-to-end run failed with exit code {proc.returncode}")
        fig = summarize(cfg, tmp / "out")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**fig, **shape, "process_wall_s": wall}


def render(fig: dict) -> str:
    """The printed end-to-end line: the figure, the per-stage seconds and what differs from the baseline."""
    rows, st = fig["rows"], fig["stage_s"]
    lo, hi = fig["tokens_per_row"]
    per_stage = ", ".join(
        f"{k} {st[k]:.2f} s ({st[k] / max(1, rows):.2f} s/row vs official {OFFICIAL_STAGE_S[k]:.2f})"
        for k in ("talker", "flow", "hift")
    )
    tokens = f"{lo}" if lo == hi else f"{lo}-{hi}"
    steps = "default" if fig["n_timesteps"] is None else fig["n_timesteps"]
    return (
        f"[end-to-end] {rows} rows x {fig['tokens_requested']} tokens (min = max; {tokens} reached flow), "
        f"prompt {fig['prompt_seconds']:.1f} s = {'/'.join(map(str, fig['prompt_tokens']))} tokens, prompt "
        f"text {fig['prompt_ids']} + text {'/'.join(map(str, fig['text_ids']))} ids, "
        f"{fig['load_format']} weights: "
        f"{fig['audio_s']:.1f} s audio in {fig['stage_wall_s']:.1f} s of talker+flow+hift -> "
        f"{fig['audio_s_per_wall_s']:.3f} audio s per wall s vs official "
        f"{OFFICIAL_AUDIO_S:.1f}/{OFFICIAL_WALL_S:.2f} = {fig['official_audio_s_per_wall_s']:.3f} "
        f"(ratio {fig['ratio_vs_official']:.2f}x)\n"
        f"  per stage: {per_stage}; frontend {st['frontend']:.2f} s (not in the baseline)\n"
        f"{render_rates(fig)}\n"
        f"  whole model run incl. frontend: {fig['model_wall_s']:.1f} s -> "
        f"{fig['audio_s_per_model_wall_s']:.3f} audio s per wall s; "
        f"process incl. load {fig['process_wall_s']:.1f} s\n"
        f"  differs from the baseline: {rows} rows in batches of {fig['batch_size']} (baseline: batch 1), "
        f"cosyclone's stages instead of the official modules, {fig['device']} {fig['dtype']} "
        f"(linear layers on {fig['cpu_gemm']}) "
        f"(baseline: 2-thread CPU float32), flow steps {steps} (baseline 10), one timed run without warm-up "
        f"(baseline: median of 3 after a warm-up), stop ids blocked below min_len "
        f"(baseline: masked to -inf), "
        f"silent-token filter on; stage seconds are the sums in diagnostics.jsonl"
    )


def render_rates(fig: dict) -> str:
    """The stages' rates side by side: the frontend must keep ahead of the talker and code2wav."""
    r, workers = fig["rates"], int(fig.get("frontend_workers") or 1)
    front = r["frontend_per_worker"]
    return (f"  rows/s on these rows ({fig.get('distinct_prompts', '?')} distinct prompts): frontend "
            f"{front:.2f} per prompt worker, {front * workers:.2f} with the run's {workers}; talker "
            f"{r['talker']:.2f}; code2wav {r['code2wav']:.2f}")


def main() -> None:
    from benchmarks.machine import describe, native_bf16

    print(
        f"[machine] {describe()}; the official constants were measured on an Intel Xeon with AMX in another "
        "run, so the ratios below compare this machine's cosyclone with that machine's official code, not "
        "alternated with it (an honest ratio alternates both codes in one window: docs/benchmarks.md)",
        flush=True,
    )
    run_stage_benchmarks()
    base = E2EConfig.from_env()
    extra = os.environ.get("COSYCLONE_BENCH_E2E_ALSO", "bf16" if native_bf16() else "")
    if "COSYCLONE_BENCH_E2E_ALSO" not in os.environ and not native_bf16():
        print(
            "[end-to-end] bf16 pass skipped: this CPU has no native bf16 (emulated bf16 makes the flow about "
            "6.8x slower than fp32; set COSYCLONE_BENCH_E2E_ALSO=bf16 to run it anyway)",
            flush=True,
        )
    for dtype in dict.fromkeys([base.dtype, *(d for d in extra.split(",") if d)]):  # ordered, no repeats
        print(render(end_to_end(replace(base, dtype=dtype))), flush=True)


if __name__ == "__main__":
    main()
