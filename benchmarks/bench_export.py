"""Peak memory and time of ``cosyclone export`` on a 2,000- and a 20,000-row run folder, both formats.

Usage: ``python -m benchmarks.bench_export [--rows 2000,20000] [--shard-size 500MB] [--keep DIR]``
(``COSYCLONE_BENCH_EXPORT_ROWS`` sets ``--rows`` in ``make bench``).

Each folder is written directly, as a finished run leaves it, without the model: ``wavs/<id>.wav`` (24 kHz
PCM16, 1.0 to 2.0 s of a tone under noise, no two alike: about 72 kB a row, so 20,000 rows are 1.4 GB) and a
compacted ``diagnostics.jsonl`` whose records have a real run's fields and size (about 1.5 kB). Each export
runs as the real CLI in a child process; printed per folder and format: rows, seconds, the child's peak RSS
(``wait4``'s ``ru_maxrss``: the process's own high-water mark, reaped once) and the shards written, then the
ratio of the 20,000-row peak to the 2,000-row one. Export holds one row's file and one Parquet row group (100
rows) at a time; what grows is the index (46 bytes a record line, under 1 MB at 20,000 rows) and an open
Parquet shard's footer (a few hundred bytes a row group), so the ratio should stay near 1. The first line is
the floor: a process that only imports what the Parquet path imports (pyarrow's first conversion adds about 50
MB more).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import describe

ROOT = Path(__file__).resolve().parents[1]
RATE = 24000


def _pool(n: int = 16) -> list[Any]:
    """``n`` tones of 1.0-2.0 s, the rows' material (each row adds its own noise: no two files alike)."""
    import numpy as np

    out = []
    for k in range(n):
        samples = int(RATE * (1.0 + k / max(1, n - 1)))
        out.append(0.3 * np.sin(2 * np.pi * (150 + 25 * k) * np.arange(samples) / RATE))
    return out


def _record(i: int, samples: int) -> dict:
    """A row record shaped like a run's: its fields, one segment's sampler counters, its fingerprint parts."""
    rid = f"row{i:07d}"
    sampler = {
        "row_id": rid,
        "seed": 1000 + i,
        "segment": 0,
        "steps": 40,
        "tokens_emitted": 40,
        "stop_reason": "eos",
        "nan_steps": 0,
        "all_nan_steps": 0,
        "posinf_steps": 0,
        "no_finite_steps": 0,
        "ras_fallbacks": 0,
        "ras_sole_restores": 0,
        "min_len_suppressed": 0,
        "policy": "exclude",
        "draw": "race",
        "legacy": False,
        "error": None,
    }
    return {
        "id": rid,
        "line": i + 1,
        "seed": 1000 + i,
        "status": "ok",
        "reason": None,
        "error": None,
        "error_type": None,
        "traceback": None,
        "tokens": [40],
        "stop_reasons": ["eos"],
        "audio_seconds": samples / RATE,
        "samples": samples,
        "sample_rate": RATE,
        "nonfinite_audio_samples": 0,
        "seconds": {"frontend": 0.01, "talker": 0.5, "flow": 0.8, "hift": 0.05},
        "wav": f"wavs/{rid}.wav",
        "text": f"Row number {i} reads a sentence of ordinary length about the weather and the sea.",
        "prompt_text": "This is the reference speaker talking.",
        "prompt_audio": "/data/prompts/speaker1.wav",
        "mode": "zero_shot",
        "instruct": None,
        "speed": 1.0,
        "manifest": "/data/m.jsonl",
        "shard": None,
        "segments": [{"text": "row number reads a sentence", "text_ids": 18, "prompt_ids": 9}],
        "fingerprint": f"{i:064x}",
        "fingerprint_parts": {k: f"{i:016x}" for k in ("text", "prompt", "seed", "model", "options")},
        "run_id": "bench",
        "finished_at": 1.7e9 + i,
        "sampler": [sampler],
    }


def build_folder(out: Path, rows: int) -> float:
    """Write a finished run folder of ``rows`` rows; returns its audio bytes (no fsync: a benchmark's
    scratch)."""
    import numpy as np

    from cosyclone.folder.audio_out import encode_wav

    (out / "wavs").mkdir(parents=True, exist_ok=True)
    pool = _pool()
    rng = np.random.default_rng(rows)
    total = 0
    with open(out / "diagnostics.jsonl", "w", encoding="utf-8") as diag:
        for i in range(rows):
            base = pool[i % len(pool)]
            wav = (base + 0.01 * rng.standard_normal(base.size)).astype(np.float32)  # unique, like real rows
            data = encode_wav(wav, sample_rate=RATE, float_wav=False)
            (out / "wavs" / f"row{i:07d}.wav").write_bytes(data)
            total += len(data)
            diag.write(json.dumps(_record(i, wav.size), sort_keys=True) + "\n")
    return float(total)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def timed(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd`` in a child: wall seconds, its peak RSS (MiB) and its stdout lines.

    This process imports neither numpy nor cosyclone (the folders are built by children too): a
    child's ``ru_maxrss`` starts from its parent's RSS at the spawn, so a large parent would mask
    the figure being measured.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    streams: dict[str, str] = {}
    drains = [threading.Thread(target=lambda n=n, fh=fh: streams.__setitem__(n, fh.read()), daemon=True)
              for n, fh in (("out", proc.stdout), ("err", proc.stderr))]
    for t in drains:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)  # reaped here, once: this child's own high-water mark
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in drains:
        t.join()
    stdout, stderr = streams.get("out", ""), streams.get("err", "")
    if proc.returncode != 0:
        print(stdout, stderr, file=sys.stderr)
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed with exit code {proc.returncode}")
    return {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024, "lines": stdout.strip().splitlines()}


def timed_export(out: Path, fmt: str, shard_size: str, to: Path) -> dict[str, Any]:
    """``cosyclone export`` (the real CLI) in a child: seconds, peak RSS, shards and its summary line."""
    fig = timed([sys.executable, "-m", "cosyclone.cli", "export", str(out), "--format", fmt, "--shard-size",
                 shard_size, "--to", str(to)])
    return {**fig, "shards": len(fig["lines"]) - 1, "summary": fig["lines"][-1]}


# the Parquet path's imports
IMPORTS = "import cosyclone.cli, cosyclone.export.build, pyarrow.parquet, soundfile"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=os.environ.get("COSYCLONE_BENCH_EXPORT_ROWS", "2000,20000"),
                    help="comma-separated folder sizes (the first and the last are compared)")
    ap.add_argument("--shard-size", default="500MB")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument("--build", nargs=2, metavar=("OUT", "ROWS"), help=argparse.SUPPRESS)  # a child's job
    args = ap.parse_args(argv)
    if args.build:
        print(build_folder(Path(args.build[0]), int(args.build[1])))
        return
    floor = timed([sys.executable, "-c", IMPORTS])
    print(
        f"[export] a process that only imports the CLI, pyarrow and soundfile: "
        f"peak RSS {floor['peak_mib']:.0f} MiB; this "
        f"benchmark's own process {_self_rss_mib():.0f} MiB ({describe()})",
        flush=True,
    )
    sizes = [int(x) for x in str(args.rows).split(",") if x]
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="cosyclone-bench-export-"))
    figures: dict[tuple[str, int], dict[str, float | int | str]] = {}
    try:
        for rows in sizes:
            out = tmp / f"run-{rows}"
            built = timed([sys.executable, "-m", "benchmarks.bench_export", "--build", str(out), str(rows)])
            print(
                f"[export] folder of {rows} rows, {float(built['lines'][-1]) / 1e9:.2f} GB of WAVs, "
                f"written in {built['wall_s']:.1f} s",
                flush=True,
            )
            for fmt in ("parquet", "webdataset"):
                fig = timed_export(out, fmt, args.shard_size, tmp / f"shards-{rows}-{fmt}")
                figures[(fmt, rows)] = fig
                print(
                    f"[export] {fmt}, {rows} rows: {fig['wall_s']:.1f} s ({rows / float(fig['wall_s']):.0f} "
                    f"rows/s), peak RSS {fig['peak_mib']:.0f} MiB, {fig['shards']} shards of at most "
                    f"{args.shard_size} on {describe()}",
                    flush=True,
                )
                shutil.rmtree(tmp / f"shards-{rows}-{fmt}", ignore_errors=True)
            if args.keep is None:
                shutil.rmtree(out, ignore_errors=True)
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            for fmt in ("parquet", "webdataset"):
                a, b = figures[(fmt, lo)], figures[(fmt, hi)]
                print(
                    f"[export] {fmt}: peak RSS {hi} rows / {lo} rows = {float(b['peak_mib']):.0f} / "
                    f"{float(a['peak_mib']):.0f} MiB = {float(b['peak_mib']) / float(a['peak_mib']):.2f}x "
                    f"for {hi / lo:.0f}x the rows; "
                    f"time {float(b['wall_s']) / float(a['wall_s']):.1f}x ({describe()})",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _self_rss_mib() -> float:
    """This process's RSS now (a child's peak can be no lower than its parent's at the spawn)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


if __name__ == "__main__":
    main()
