"""The folder says its format: a real run's ``summary.json`` and index carry ``folder_format``, and
docs/output.md lists what every version up to it changed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder import layout as runfolder
from cosyclone.folder.version import FOLDER_FORMAT

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_writes_its_folder_format_in_the_summary_and_the_index(tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    prompt = ROOT / "manifests" / "prompts" / "speaker1.wav"
    manifest.write_text(json.dumps({"id": "a", "prompt_audio": str(prompt), "text": "Hello.",
                                    "prompt_text": "This is the reference speaker."}) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(tiny_model_dir), "--out",
                                   str(out), "--max-tokens", "3", "--n-timesteps", "1", "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["folder_format"] == FOLDER_FORMAT
    index = runfolder.open_index(out)
    try:
        row = index.db.execute("SELECT value FROM meta WHERE key = 'folder_format'").fetchone()
        assert row is not None and int(row[0]) == FOLDER_FORMAT
    finally:
        index.close()


def test_the_output_page_lists_what_every_format_version_changed() -> None:
    page = (ROOT / "docs" / "output.md").read_text()
    section = page[page.index("## Format versions"):]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    listed = [int(n) for n in re.findall(r"^\| (\d+) \|", section, re.M)]
    assert listed == list(range(1, FOLDER_FORMAT + 1))
