"""A run stopped as schedulers and people stop it: SIGTERM (Slurm, Kubernetes, a spot instance: a
kill follows some seconds later) and Ctrl-C (SIGINT), through the real CLI in a subprocess on the
tiny model (issue 41).

A stopped run admits no new row, lets the rows in flight finish within ``--grace``, writes its
accounts (diagnostics, metadata, summary, a runs.jsonl line naming the signal), releases the lock,
says in one line how far it got and exits 143 or 130; the rerun makes the remaining rows, each once.
A second signal stops at once, and still nothing is torn; ``say`` writes no file when stopped.
No assertion times a wall clock (one failed under load): each is an ordering check, what happened
before what, read from the folder and the process's own words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile as sf

from cosyclone.folder.layout import wav_path
from tests.run.test_runfolder import journal_lines, write_manifest
from tests.run_folders import ROOT, diag_lines

N_ROWS = 40
GRACE = 10.0
QUICK = ["--device", "cpu", "--max-tokens", "6", "--n-timesteps", "1", "--batch-size", "4"]


def start(manifest: Path, model: Path, out: Path, *args: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "cosyclone.cli",
        "synth",
        str(manifest),
        "--model-dir",
        str(model),
        "--out",
        str(out),
        "--progress-interval",
        "1",
        *args,
    ]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def signal_after(proc: subprocess.Popen, out: Path, rows: int, *signals: signal.Signals,
                 timeout: float = 240.0) -> tuple[int, str, str]:
    """Send ``signals`` (one after the other) once ``rows`` rows are written; the rows written when the
    first was sent, and the process's stdout and stderr."""
    t0 = time.time()
    while journal_lines(out) < rows:
        assert proc.poll() is None, f"the run ended before the signal: {proc.communicate()}"
        assert time.time() - t0 < timeout, "no progress"
        time.sleep(0.02)
    before = journal_lines(out)
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=GRACE + 60)
    return before, stdout, stderr


def wait_for_handlers(proc: subprocess.Popen, timeout: float = 240.0) -> None:
    """Wait until ``proc`` catches SIGTERM (the doors' ``catch_signals`` is in place: an ordering
    check, where a fixed sleep lost the race to a slow start under load)."""
    t0 = time.time()
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None, f"the command ended first: {proc.communicate()}"
        assert time.time() - t0 < timeout, "the command never caught signals"
        time.sleep(0.02)


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    return False


def assert_folder_whole(out: Path) -> list[dict]:
    """What a stopped run must leave: an ok record for every file and a whole file for every ok record,
    metadata of the ok rows, no lock, no journal, no temporary file. Returns the records."""
    records = diag_lines(out)
    ok = {d["id"]: d for d in records if d["status"] == "ok"}
    assert len(ok) == len(records) == len({d["id"] for d in records})  # one record per row, all ok
    wavs = sorted(p.stem for p in (out / "wavs").rglob("*.wav"))
    assert wavs == sorted(ok)
    for rid, d in ok.items():
        assert sf.info(str(wav_path(out, rid))).frames == d["samples"]  # whole, as recorded
    metadata = [
        json.loads(x) for m in (out / "wavs").rglob("metadata.jsonl") for x in m.read_text().splitlines()
    ]
    assert sorted(m["id"] for m in metadata) == sorted(ok)
    assert not list((out / ".cosyclone").glob("lock-*")) and not list((out / ".cosyclone").glob("journal-*"))
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    return records


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_stops_the_run_with_its_accounts_and_the_rerun_makes_the_rest(
    tiny_model_dir: Path, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    manifest, out = write_manifest(tmp_path, N_ROWS), tmp_path / "out"
    proc = start(manifest, tiny_model_dir, out, *QUICK, "--grace", f"{GRACE:g}")
    before, _, stderr = signal_after(proc, out, 4, sig)

    assert proc.returncode == code, stderr  # it ended by itself, within the grace (not killed at its end)
    done = assert_folder_whole(out)
    assert before <= len(done) < N_ROWS  # the rows in flight finished, nothing new started
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == len(done) and summary["last_run"]["stopped_by"] == sig.name
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert (
        len(runs) == 1 and runs[0]["stopped_by"] == sig.name and runs[0]["not_written"] == N_ROWS - len(done)
    )
    last = stderr.strip().splitlines()[-1]
    assert (
        last
        == f"interrupted by {sig.name}: {len(done)} of {N_ROWS} rows done; rerun the same command to resume"
    )
    assert f"{sig.name}: stopping; no new rows start, rows in flight get {GRACE:g} s" in stderr

    again = start(manifest, tiny_model_dir, out, *QUICK)
    _, stderr = again.communicate(timeout=240)
    assert again.returncode == 0, stderr
    records = assert_folder_whole(out)
    assert sorted(d["id"] for d in records) == [f"r{i:02d}" for i in range(N_ROWS)]  # each id once
    run = json.loads((out / "summary.json").read_text())["last_run"]
    assert (run["skipped"], run["done"], run["stopped_by"]) == (len(done), N_ROWS - len(done), None)


def test_a_second_signal_drops_the_rows_in_flight_at_once_and_tears_nothing(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """Long rows (2000 tokens each, seconds of decoding per batch) and a long grace: the first SIGTERM
    alone would wait for the batch in the talker; the second ends the run at the next decode window,
    dropping that batch unrecorded."""
    manifest, out = write_manifest(tmp_path, 6), tmp_path / "out"
    # two talker slots: the second batch can only enter the talker once the first has left it, so at the
    # signals (sent once the first batch is written) the second is decoding its 2000 tokens, whatever the load
    long_rows = ["--device", "cpu", "--max-tokens", "2000", "--min-tokens", "2000", "--n-timesteps", "1",
                 "--batch-size", "2", "--talker-slots", "2", "--grace", "120"]
    proc = start(manifest, tiny_model_dir, out, *long_rows)
    before, _, stderr = signal_after(proc, out, 2, signal.SIGTERM, signal.SIGTERM)

    assert proc.returncode == 143, stderr
    assert "SIGTERM: stopping at once" in stderr
    # the order of events, not a clock: the second batch was in the talker at the signals and is not
    # recorded, though the grace (120 s) would have let it finish: it was dropped, not waited for
    assert before == 2 and len(assert_folder_whole(out)) == 2
    assert json.loads((out / "runs.jsonl").read_text().splitlines()[-1])["stopped_by"] == "SIGTERM"

    again = start(manifest, tiny_model_dir, out, *long_rows)
    _, stderr = again.communicate(timeout=400)
    assert again.returncode == 0, stderr
    assert sorted(d["id"] for d in assert_folder_whole(out)) == [f"r{i:02d}" for i in range(6)]


def test_say_stopped_by_ctrl_c_exits_130_and_writes_no_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    text = " ".join(
        f"Sentence number {k} of a long text that keeps the talker busy for a while." for k in range(80)
    )
    wav = tmp_path / "said.wav"
    cmd = [sys.executable, "-m", "cosyclone.cli", "say", text, "--prompt-audio",
           str(ROOT / "manifests" / "prompts" / "speaker1.wav"), "--prompt-text", "reference words",
           "--model-dir", str(tiny_model_dir), "--device", "cpu", "--n-timesteps", "1", "-o", str(wav)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    wait_for_handlers(proc)  # the command catches signals now (a signal during imports would not be its)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr  # the signal came before the synthesis ended, and stopped it
    assert stderr.strip().splitlines()[-1] == "interrupted by SIGINT: no WAV written"
    assert list(tmp_path.iterdir()) == []  # no file, whole or partial
