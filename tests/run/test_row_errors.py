"""A row that passes validation but fails in a stage is reported on the terminal by manifest line,
recorded in diagnostics, and the other rows are still produced (exit code 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from tests.run_folders import ROOT, diags


def test_stage_failure_names_the_manifest_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows = [
        {"id": "good", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference", "text": "hello"},
        # passes validation (it has words) but has no sentence mark to split at: too long for the LLM
        {
            "id": "dots",
            "prompt_audio": "prompts/speaker2.wav",
            "prompt_text": "reference",
            "text": "很" * 3000,
        },
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "--model-dir", str(tiny_model_dir),
                                   "--out", str(tmp_path / "out"), "--device", "cpu", "--max-tokens", "4",
                                   "--n-timesteps", "1"])
    assert res.exit_code == 3, res.output
    assert "line 2, row 'dots': frontend: TextError" in res.output
    d = diags(tmp_path / "out")
    assert (
        d["dots"]["status"] == "failed"
        and d["dots"]["line"] == 2
        and "Add sentence punctuation" in d["dots"]["error"]
    )
    assert d["good"]["status"] == "ok" and wav_path(tmp_path / "out", "good").is_file()
    assert not wav_path(tmp_path / "out", "dots").exists()
