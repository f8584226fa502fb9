"""``report`` tells a dataset builder what to read before loading a folder: ok rows at several sample
rates, formats or encodings, a synth still writing it, and the mix of where the rows ran."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.engine import RowResult
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.folder.row_record import RowStamp
from cosyclone.folder.settle import settle
from cosyclone.folder.writer import BackgroundWriter, WriterOptions
from tests.every_record import read_records
from tests.run_folders import metadata_lines


def _stamp(run_id: str, threads: str) -> RowStamp:
    return RowStamp(
        fingerprint="f",
        fingerprint_parts={},
        run_id=run_id,
        text="t",
        prompt_text="",
        prompt_audio="p",
        mode="cross_lingual",
        instruct="",
        speed=1.0,
        manifest="m",
        shard=None,
        device="cpu",
        threads=threads,
    )


def _write(out: Path, ids: list[str], output: AudioOutput, run_id: str, threads: str,
           model_seconds: float = 0.1) -> None:
    writer = BackgroundWriter(WriterOptions(out_dir=out, output=output), runfolder.journal_path(out, "all"))
    for i, rid in enumerate(ids):
        writer.submit(RowResult(id=rid, line=i + 1, seed=0, audio=np.full(2400, 0.1, np.float32),
                                audio_seconds=model_seconds), _stamp(run_id, threads))
    writer.close()
    settle(out, "all")


def _report(out: Path) -> dict:
    res = CliRunner().invoke(app, ["report", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_report_flags_mixed_rates_formats_and_encodings_and_shows_where_rows_ran(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, ["a", "b", "c"], AudioOutput(), "run1", "2")  # 24 kHz PCM16 WAV
    _write(out, ["d"], AudioOutput(sample_rate=16000, format="flac", encoding="pcm24"), "run2", "1")
    for run_id, torch in (("run1", "2.5"), ("run2", "2.6")):
        runfolder.append_jsonl(out / runfolder.RUNS_NAME, {"run_id": run_id, "versions": {"torch": torch}})
    totals = _report(out)
    assert totals["files"] == {"sample_rate": {"16000": 1, "24000": 3}, "audio_format": {"flac": 1, "wav": 3},
                               "encoding": {"pcm16": 3, "pcm24": 1}}
    flags = totals["flags"]
    assert len(flags) == 3 and flags[0].startswith("mixed sample rates among ok rows: 3 rows at 24000 Hz, "
                                                   "1 rows at 16000 Hz")
    assert totals["ran_on"] == {"device": {"cpu": 4}, "threads": {"1": 1, "2": 3}}
    assert totals["versions"] == {"torch 2.5": 3, "torch 2.6": 1}
    assert abs(totals["audio_seconds"] - 4 * 0.1) < 1e-6  # each file's own duration, at its own rate
    text = CliRunner().invoke(app, ["report", str(out)]).output
    assert "warning: mixed sample rates" in text and "versions: 3 rows: torch 2.5; 1 rows: torch 2.6" in text


def test_report_flags_a_running_writer_and_not_a_dead_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, ["a"], AudioOutput(), "run1", "2")
    assert _report(out)["flags"] == []
    lock = runfolder.state_dir(out) / "lock-all.json"
    lock.write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": 0, "shard": "all"})
    )
    (flag,) = _report(out)["flags"]
    assert f"{out} is being written by a running synth (pid {os.getpid()}" in flag
    dead = 2**22 + 12345  # above any pid_max a test machine uses
    lock.write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "started": 0, "shard": "all"}))
    assert _report(out)["flags"] == []


def test_summary_json_counts_the_files_not_the_models_audio(tmp_path: Path) -> None:
    from cosyclone.folder.totals import folder_totals

    out = tmp_path / "out"
    # as if trimmed to 0.1 s
    _write(out, ["a"], AudioOutput(sample_rate=8000), "run1", "2", model_seconds=5.0)
    (rec,) = read_records(out).values()
    assert rec.samples == 800 and rec.audio_seconds == 5.0
    assert folder_totals([rec])["audio_seconds"] == 0.1
    assert metadata_lines(out)["a"]["duration"] == 0.1
