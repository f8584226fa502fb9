"""The nightly loop's second half on a tiny model: `synth OUT/redo.jsonl --out OUT` redoes exactly
the rows eval listed, in place, with their new seeds, and leaves every other row as it was.

No ASR is needed here: redo.jsonl is written by the same function eval calls (write_redo) for
the rows a --max-wer would have failed. It works because the run folder resumes by fingerprint:
a row is skipped only when its fingerprint, seed included, matches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.eval.folder import read_folder
from cosyclone.eval.redo import redo_seed, write_redo
from cosyclone.folder.layout import wav_path

ROOT = Path(__file__).resolve().parents[2]


def _synth(manifest: Path, model_dir: Path, out: Path):
    return CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out),
                                    "--device", "cpu", "--max-tokens", "6", "--n-timesteps", "2"])


def _latest(out: Path) -> dict[str, dict]:
    """Each row's current record: records are appended run by run, so a row's later line wins."""
    lines = [json.loads(raw) for raw in (out / "diagnostics.jsonl").read_text().splitlines()]
    return {d["id"]: d for d in lines}


def test_synth_of_redo_jsonl_redoes_exactly_the_listed_rows_in_place(tiny_model_dir: Path, tmp_path: Path):
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows = [{"id": f"r{i}", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words",
             "text": "hello world " * (i + 1)} for i in range(3)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert _synth(manifest, tiny_model_dir, out).exit_code == 0
    before = _latest(out)
    wav_before = {rid: wav_path(out, rid).read_bytes() for rid in before}

    folder = read_folder(out, manifest)
    redo = write_redo(out, [f for f in folder.rows if f.row.id == "r1"])
    res = _synth(redo, tiny_model_dir, out)
    assert res.exit_code == 0, res.output

    after = _latest(out)
    assert after["r1"]["seed"] == redo_seed("r1", before["r1"]["seed"])
    assert (
        after["r1"]["run_id"] != before["r1"]["run_id"]
        and after["r1"]["fingerprint"] != before["r1"]["fingerprint"]
    )
    assert after["r1"]["fingerprint_parts"]["seed"] != before["r1"]["fingerprint_parts"]["seed"]
    assert wav_path(out, "r1").read_bytes() != wav_before["r1"]  # new seed, new tokens, new audio
    for rid in ("r0", "r2"):
        assert after[rid] == before[rid] and wav_path(out, rid).read_bytes() == wav_before[rid]
    ids = [json.loads(raw)["id"] for raw in (out / "diagnostics.jsonl").read_text().splitlines()]
    assert sorted(ids) == ["r0", "r1", "r1", "r2"]  # the redo appended r1's new record, nothing else
