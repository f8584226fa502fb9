"""Time and peak memory of the commands on a run folder of a million records (issue 50's figures).

Usage: ``python -m benchmarks.bench_folder [--records 1000000] [--quick] [--keep DIR]``
(``COSYCLONE_BENCH_FOLDER_RECORDS`` sets ``--records`` in ``make bench``; ``--quick``: 20,000).

The folder is what an earlier version left after weeks of nightly runs: ``diagnostics.jsonl`` alone,
each line a copy of a real record (a row synthesized here with the tiny model, its id, line and
file renamed), no audio files and no index. Each command runs as the real CLI in a child process
(``wait4``'s ``ru_maxrss``: the child's own peak RSS), in this order:

0. the same 4-row ``synth`` into an empty folder: the model's share of a 4-row run (loading, the
   text normalizer, four rows), so that what the big folder adds is the difference (on a shared
   machine the load average, printed beside each figure, moves both);
1. a 4-row ``synth`` of new rows into it (the first: the index is built from the records, streaming);
2. a second 4-row ``synth`` of other new rows (the index is read, not built);
3. ``cosyclone report`` on it;
4. ``synth --dry-run`` of a manifest of every row of the folder (the resume plan).

Printed: seconds and peak RSS of each, beside issue 50's targets for a million records (2 min and
2 GB, 30 s, 60 s and 1 GB, 3 min and 3 GB). The quick mode's figures are not held to those targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_export import timed
from benchmarks.machine import describe

ROOT = Path(__file__).resolve().parents[1]
QUICK_RECORDS = 20_000
PROMPT = ROOT / "manifests" / "prompts" / "speaker1.wav"
PROMPT_TEXT = "This is the reference speaker talking."
TEXT = "Tomorrow will be sunny with a light breeze from the west."
#: command -> (seconds, MiB) that issue 50 asks for at a million records
TARGETS: dict[str, tuple[int | None, int | None]] = {
    "synth 4 rows into an empty folder": (None, None),
    "synth 4 rows (first)": (120, 2048),
    "synth 4 rows (second)": (30, None),
    "report": (60, 1024),
    "synth --dry-run (resume plan)": (180, 3072),
}


def _row(rid: str, prompt: Path) -> str:
    return (
        json.dumps({"id": rid, "prompt_audio": str(prompt), "prompt_text": PROMPT_TEXT, "text": TEXT}) + "\n"
    )


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cosyclone.cli", *args]


def build(work: Path, records: int) -> None:
    """The folder (``work/out``, ``diagnostics.jsonl`` only) and the manifests, from ``work/seed``'s
    record."""
    seed = json.loads((work / "seed" / "diagnostics.jsonl").read_text().splitlines()[0])
    out = work / "out"
    out.mkdir()
    with open(out / "diagnostics.jsonl", "w", encoding="utf-8") as diag, \
            open(work / "all.jsonl", "w", encoding="utf-8") as manifest:
        for i in range(records):
            rid = f"r{i:07d}"
            # an earlier version's flat place
            line = {**seed, "id": rid, "line": i + 1, "file": f"wavs/{rid}.wav"}
            diag.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
            manifest.write(_row(rid, PROMPT))
    for name, first in (("four.jsonl", 0), ("four2.jsonl", 4)):
        (work / name).write_text("".join(_row(f"new{first + k}", PROMPT) for k in range(4)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--records", type=int, default=int(os.environ.get("COSYCLONE_BENCH_FOLDER_RECORDS", 1_000_000))
    )
    ap.add_argument("--quick", action="store_true", help=f"a folder of {QUICK_RECORDS} records")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument("--build", nargs=2, metavar=("WORK", "RECORDS"), help=argparse.SUPPRESS)  # a child's job
    args = ap.parse_args(argv)
    if args.build:
        build(Path(args.build[0]), int(args.build[1]))
        return
    records = QUICK_RECORDS if args.quick else args.records
    work = args.keep or Path(tempfile.mkdtemp(prefix="cosyclone-bench-folder-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        model = work / "tiny"
        timed(_cli("make-tiny-model", str(model), "--force"))
        (work / "one.jsonl").write_text(_row("seed", PROMPT))
        timed(_cli("synth", str(work / "one.jsonl"), "--model-dir", str(model), "--out", str(work / "seed")))
        built = timed([sys.executable, "-m", "benchmarks.bench_folder", "--build", str(work), str(records)])
        size = (work / "out" / "diagnostics.jsonl").stat().st_size
        print(
            f"[folder] {records} records ({size / 1e9:.2f} GB of diagnostics.jsonl, no audio, no index) "
            "written in "
            f"{built['wall_s']:.1f} s; {describe()}; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        out = str(work / "out")
        steps = {
            "synth 4 rows into an empty folder": _cli(
                "synth", str(work / "four.jsonl"), "--model-dir", str(model), "--out", str(work / "empty")
            ),
            "synth 4 rows (first)": _cli(
                "synth", str(work / "four.jsonl"), "--model-dir", str(model), "--out", out
            ),
            "synth 4 rows (second)": _cli(
                "synth", str(work / "four2.jsonl"), "--model-dir", str(model), "--out", out
            ),
            "report": _cli("report", out),
            "synth --dry-run (resume plan)": _cli(
                "synth", str(work / "all.jsonl"), "--model-dir", str(model), "--out", out, "--dry-run"
            ),
        }
        control = None
        for name, cmd in steps.items():
            fig = timed(cmd)
            secs, mib = TARGETS[name]
            target = (
                (f"target at 1M records: <= {secs} s" + (f", <= {mib} MiB" if mib else ""))
                if secs
                else "control"
            )
            extra = ""
            if control is not None and name.startswith("synth 4"):
                extra = f", {fig['wall_s'] - control:+.1f} s beside the empty folder"
            control = fig["wall_s"] if control is None else control
            print(
                f"[folder] {name}: {fig['wall_s']:.1f} s{extra}, "
                f"peak RSS {fig['peak_mib']:.0f} MiB ({target}); "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
