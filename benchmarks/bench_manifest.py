"""Time to first row on a big manifest: ``cosyclone synth --dry-run`` of N short English rows.

Usage: ``python -m benchmarks.bench_manifest [--rows 200000] [--model-dir DIR] [--repeat 1] [--keep DIR]
[--against OTHER_CHECKOUT]``.

Writes N rows (unique short English texts with numbers, dates and money, three prompts, zero_shot)
into a temporary folder, makes a tiny model there unless ``--model-dir`` is given, and times the
real CLI's ``synth --dry-run`` in a subprocess twice: first with a cold text cache, then again on
the same output folder (a resume: what the first pass normalized comes from the cache). A dry run
normalizes only the texts it cannot judge unnormalized (none of these), so the two passes now
cost the same; before that change the cold pass normalized every text.
Printed per pass: wall seconds, rows per second, CPU seconds of the process and its workers (the
figure to compare on a busy shared machine), and peak memory, both the largest single
process of that pass (``wait4``'s ``ru_maxrss``) and the whole process tree (summed RSS sampled
every 20 ms: the normalization workers count too), and the machine's load as the pass starts.
``COSYCLONE_CACHE_DIR`` points into the temporary folder so the user's file-hash and text caches are neither
read nor touched. ``--against DIR`` (a folder holding another version's ``cosyclone`` package, e.g. ``git
archive REV cosyclone | tar -x -C DIR``) times that version too, the two taking turns in each repeat (A B A
B), and prints the ratio of the
medians: the honest comparison on a shared machine.

``--first-row N`` (``COSYCLONE_BENCH_FIRST_ROW_ROWS``, 6000 in ``make bench``; 0 skips it) times
what a night waits for: seconds from the start of a real ``synth`` of N rows (tiny model, cold
text cache) to its first WAV, streamed (the default) and with the manifest read whole first
(``--shard 0/1``), the two alternated; each run is stopped at its first WAV.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import describe

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TEXTS = ("This is the reference speaker talking.", "I recorded this sentence for you.",
                "Good morning, this is my usual speaking voice.")
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "cats",
    "sleep",
    "near",
    "warm",
    "fires",
    "tomorrow",
    "will",
    "be",
    "sunny",
    "with",
    "light",
    "breeze",
    "from",
    "west",
    "and",
    "few",
    "clouds",
    "late",
    "afternoon",
    "please",
    "read",
    "this",
    "sentence",
    "slowly",
    "calmly",
    "so",
    "everyone",
    "in",
    "room",
    "can",
    "follow",
    "every",
    "word",
    "we",
    "walked",
    "along",
    "quiet",
    "river",
    "bank",
    "watched",
    "boats",
    "drift",
    "past",
    "under",
    "old",
    "stone",
    "bridge",
]


def row_text(rng: random.Random, i: int) -> str:
    """A unique short English text (10-20 words) with a number, and now and then money or a time."""
    words = rng.choices(WORDS, k=rng.randint(10, 20))
    words.insert(rng.randrange(len(words)), str(i))
    extra = rng.random()
    if extra < 0.2:
        words.append(f"for ${rng.randint(1, 99)}.{rng.randint(10, 99)}")
    elif extra < 0.4:
        words.append(f"at {rng.randint(1, 12)}:{rng.randint(10, 59)}")
    return " ".join(words).capitalize() + rng.choice(".?!")


def write_manifest(folder: Path, rows: int, seed: int = 0) -> Path:
    """``folder/m.jsonl`` with ``rows`` rows over the three example prompts (copied next to it)."""
    folder.mkdir(parents=True, exist_ok=True)
    for k in (1, 2, 3):
        shutil.copy(ROOT / "manifests" / "prompts" / f"speaker{k}.wav", folder / f"prompt{k}.wav")
    rng = random.Random(seed)
    path = folder / "m.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            k = i % 3
            fh.write(json.dumps({"id": f"r{i:07d}", "prompt_audio": f"prompt{k + 1}.wav",
                                 "prompt_text": PROMPT_TEXTS[k], "text": row_text(rng, i)}) + "\n")
    return path


def _tree_rss(pid: int) -> int:
    """Summed RSS in bytes of ``pid`` and its descendants (0 when gone)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return total


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, float | str]:
    """Run ``cmd``; wall seconds, CPU seconds, peak single-process and peak process-tree RSS (MiB).

    The CPU seconds and the single-process peak are this child's own (``wait4``: it and the workers
    it waited for), not the running maximum over every child this benchmark ever started, which
    would repeat the largest earlier pass (or ``make-tiny-model``) in every later line.
    """
    load = os.getloadavg()[0]  # the machine's 1-minute load as the pass starts (others' work included)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()
    streams: dict[str, str] = {}

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.02)

    def drain(name: str, fh: Any) -> None:
        streams[name] = fh.read()

    threads = [threading.Thread(target=sample, daemon=True),
               *(threading.Thread(target=drain, args=(n, fh), daemon=True)
                 for n, fh in (("out", proc.stdout), ("err", proc.stderr)))]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)  # reaped here, once: nothing else polls the child
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    done.set()
    for t in threads:
        t.join()
    out, err = streams.get("out", ""), streams.get("err", "")
    if proc.returncode not in (0, 3):
        print(out, err, file=sys.stderr)
        raise SystemExit(f"synth --dry-run failed with exit code {proc.returncode}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "max_process_mib": usage.ru_maxrss / 1024,
        "tree_mib": peak[0] / 2**20,
        "load": load,
        "plan": out.strip().splitlines()[0] if out.strip() else "",
    }


def bench(rows: int, model_dir: Path | None = None, keep: Path | None = None, repeat: int = 1,
          against: Path | None = None) -> list[dict[str, float | str]]:
    """Cold then warm ``synth --dry-run`` of a ``rows``-row manifest, ``repeat`` times (alternated with
    the code under ``against`` when given)."""
    tmp = keep or Path(tempfile.mkdtemp(prefix="cosyclone-bench-manifest-"))
    try:
        t0 = time.perf_counter()
        manifest = write_manifest(tmp, rows)
        made = time.perf_counter() - t0
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        if model_dir is None:
            model_dir = tmp / "tiny"
            if not model_dir.is_dir():
                subprocess.run(
                    [sys.executable, "-m", "cosyclone.cli", "make-tiny-model", str(model_dir)],
                    cwd=ROOT,
                    env=env,
                    check=True,
                    capture_output=True,
                )
        print(f"[manifest] {rows} rows written in {made:.1f} s", flush=True)
        codes = [("this", ROOT), *([("against", against.resolve())] if against is not None else [])]
        figures: list[dict[str, float | str]] = []
        for k in range(repeat):
            for name, code in codes:
                out, cache = tmp / f"out-{name}-{k}", tmp / f"cache-{name}-{k}"
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(cache, ignore_errors=True)
                run_env = {**env, "COSYCLONE_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(code), str(ROOT), os.environ.get("PYTHONPATH")]))}
                cmd = [sys.executable, "-m", "cosyclone.cli", "synth", str(manifest), "--out", str(out),
                       "--model-dir", str(model_dir), "--dry-run"]
                for label in ("cold", "warm"):
                    fig = {"code": name, "pass": label, **timed(cmd, run_env, tmp)}  # cwd: not a checkout
                    fig["rows_per_s"] = rows / float(fig["wall_s"])
                    figures.append(fig)
                    print(
                        f"[manifest] {name}: {rows} rows, dry run {label} (text cache "
                        f"{'empty' if label == 'cold' else 'as the cold pass left it'}): "
                        f"{fig['wall_s']:.1f} s ({fig['rows_per_s']:.0f} rows/s, {fig['cpu_s']:.1f} CPU s), "
                        f"peak RSS {fig['max_process_mib']:.0f} MiB (largest process), "
                        f"{fig['tree_mib']:.0f} MiB (process "
                        f"tree) on {describe()}, load {fig['load']:.1f} at its start; plan: {fig['plan']}",
                        flush=True,
                    )
        if against is not None:
            for label in ("cold", "warm"):
                med = {
                    name: statistics.median(
                        float(f["wall_s"]) for f in figures if f["code"] == name and f["pass"] == label
                    )
                    for name, _ in codes
                }
                print(
                    f"[manifest] {label}: median {med['this']:.1f} s this vs {med['against']:.1f} s "
                    f"{against} -> {med['against'] / med['this']:.2f}x "
                    f"({repeat} alternated runs each, {describe()})",
                    flush=True,
                )
        return figures
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def first_row(rows: int, model_dir: Path | None = None, repeat: int = 1) -> dict[str, list[float]]:
    """Seconds to the first WAV of ``synth`` on ``rows`` rows: streamed vs read whole, alternated."""
    tmp = Path(tempfile.mkdtemp(prefix="cosyclone-bench-first-row-"))
    try:
        manifest = write_manifest(tmp, rows)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        if model_dir is None:
            model_dir = tmp / "tiny"
            subprocess.run(
                [sys.executable, "-m", "cosyclone.cli", "make-tiny-model", str(model_dir)],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
            )
        found: dict[str, list[float]] = {"streamed": [], "read whole": []}
        for k in range(repeat):
            for mode in found:
                out, cache = (
                    tmp / f"out-{k}-{mode.replace(' ', '-')}",
                    tmp / f"cache-{k}-{mode.replace(' ', '-')}",
                )
                cmd = [
                    sys.executable,
                    "-m",
                    "cosyclone.cli",
                    "synth",
                    str(manifest),
                    "--out",
                    str(out),
                    "--model-dir",
                    str(model_dir),
                    "--device",
                    "cpu",
                    "--max-tokens",
                    "2",
                    "--n-timesteps",
                    "1",
                    "--quiet",
                    *(["--shard", "0/1"] if mode == "read whole" else []),
                ]
                t0 = time.perf_counter()
                proc = subprocess.Popen(
                    cmd,
                    cwd=tmp,
                    env={**env, "COSYCLONE_CACHE_DIR": str(cache)},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    while not any((out / "wavs").glob("*.wav")):
                        if proc.poll() is not None:
                            raise SystemExit(f"synth ended ({proc.returncode}) before its first WAV")
                        time.sleep(0.05)
                    found[mode].append(time.perf_counter() - t0)
                finally:
                    os.killpg(proc.pid, 9)
                    proc.wait()
        med = {m: statistics.median(v) for m, v in found.items()}
        print(
            f"[first row] {rows} rows, cold text cache: first WAV after {med['streamed']:.1f} s streamed, "
            f"{med['read whole']:.1f} s with the manifest read whole first "
            f"({med['read whole'] / med['streamed']:.1f}x; median of {repeat} alternated runs each, "
            f"{describe()})",
            flush=True,
        )
        return found
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=int(os.environ.get("COSYCLONE_BENCH_MANIFEST_ROWS", "2000")))
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--against", type=Path, default=None, help="a folder holding another cosyclone package to time"
    )
    ap.add_argument(
        "--first-row",
        type=int,
        default=int(os.environ.get("COSYCLONE_BENCH_FIRST_ROW_ROWS", "6000")),
        help="rows of the time-to-first-WAV comparison (0: skip it)",
    )
    args = ap.parse_args(argv)
    if args.rows:
        bench(args.rows, args.model_dir, args.keep, args.repeat, args.against)
    if args.first_row:
        first_row(args.first_row, args.model_dir, args.repeat)


if __name__ == "__main__":
    main()
