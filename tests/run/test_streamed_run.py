"""A run streams its manifest: the first rows are written while later lines are still being read and
validated, and the WAVs are the ones a run that read the manifest whole first writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.manifest import reader as manifest_mod
from cosyclone.manifest import stream as manifest_stream
from cosyclone.manifest.rows import parse_row
from cosyclone.run.drive import Driver
from tests.run_folders import ROOT

FAST = [
    "--max-tokens",
    "4",
    "--n-timesteps",
    "1",
    "--device",
    "cpu",
    "--quiet",
    "--batch-size",
    "2",
    "--float-wav",
]
ROWS = 6


def _manifest(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    prompt = ROOT / "manifests" / "prompts" / "speaker1.wav"
    lines = [
        json.dumps(
            {
                "id": f"r{i}",
                "prompt_audio": str(prompt),
                "prompt_text": "reference words",
                "text": "a short line" + " and more" * (i % 3) + f" number {i}.",
            }
        )
        for i in range(ROWS)
    ]
    lines.insert(3, "{not json")  # a rejected line in the middle: told as it is read, the run goes on
    path = folder / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_first_rows_are_written_before_the_last_line_is_read(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # parts of 1 line: 7 here (the next part is read one ahead, so a few parts must outlast a first row)
    monkeypatch.setattr(manifest_stream, "CHUNK_LINES", 1)
    events: list[tuple[str, Any]] = []
    real_parse, real_commit = parse_row, Driver.commit

    def parse(obj, *, line, **kw):
        events.append(("validated", line))
        return real_parse(obj, line=line, **kw)

    def commit(self, result):
        events.append(("written", result.id))
        return real_commit(self, result)

    monkeypatch.setattr(manifest_mod, "parse_row", parse)
    monkeypatch.setattr(Driver, "commit", commit)
    m = _manifest(tmp_path / "in")
    res = CliRunner().invoke(app, ["synth", str(m), "--model-dir", str(tiny_model_dir), "--out",
                                   str(tmp_path / "streamed"), *FAST])
    assert res.exit_code == 3, res.output  # the bad line is rejected, every row is written
    assert "line 4" in res.output
    first_write = next(i for i, (kind, _) in enumerate(events) if kind == "written")
    last_line = max(i for i, (kind, _) in enumerate(events) if kind == "validated")
    assert first_write < last_line, repr(events)  # the run did not wait for the whole manifest
    assert sorted(r for kind, r in events if kind == "written") == [f"r{i}" for i in range(ROWS)]

    # the same manifest read whole first (a shard of one does that) gives the same WAVs
    # (the spies stay: they only note what the real parser and commit do; the parts are the same)
    res = CliRunner().invoke(app, ["synth", str(m), "--model-dir", str(tiny_model_dir), "--out",
                                   str(tmp_path / "whole"), "--shard", "0/1", *FAST])
    assert res.exit_code == 3, res.output
    streamed = {p.name: p.read_bytes() for p in (tmp_path / "streamed" / "wavs").rglob("*.wav")}
    whole = {p.name: p.read_bytes() for p in (tmp_path / "whole" / "wavs").rglob("*.wav")}
    assert len(streamed) == ROWS and streamed == whole
    last = json.loads((tmp_path / "streamed" / "summary.json").read_text())["last_run"]
    assert last["rows_in_manifest"] == ROWS and last["invalid"] == 1 and last["done"] == ROWS
