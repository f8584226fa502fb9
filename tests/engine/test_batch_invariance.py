"""Batch N must give each row what batch 1 gives it, through the real CLI (wrong per-row offsets
once took CER from 0.05 to 0.89 at batch 4 elsewhere): same tokens, same sampler counters, and
the same audio within float32 rounding, for rows whose prompts and texts differ in length."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from tests.run_folders import ROOT, diags

# no --max-tokens: each row runs to its own max_len (20 x its text ids), so lengths differ
TEXTS = ("hi", "a longer sentence, with a comma", "medium text", "one more of another size")


def _manifest(folder: Path) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    rows = [{"id": f"row{i}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
             "prompt_text": "reference words " * (i + 1), "text": text} for i, text in enumerate(TEXTS)]
    path = folder / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(manifest: Path, model_dir: Path, out: Path, batch: int) -> dict[str, dict]:
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out),
                                   "--device", "cpu", "--n-timesteps", "2",
                                   "--batch-size", str(batch), "--float-wav", "--seed", "5"])
    assert res.exit_code == 0, res.output
    return diags(out)


def test_batch_of_four_gives_each_row_what_batch_one_gives_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    alone = _run(manifest, tiny_model_dir, tmp_path / "b1", 1)
    together = _run(manifest, tiny_model_dir, tmp_path / "b4", 4)
    assert set(alone) == set(together) == {f"row{i}" for i in range(len(TEXTS))}
    lengths = set()
    for rid, one in alone.items():
        four = together[rid]
        assert one["tokens"] == four["tokens"] and one["stop_reasons"] == four["stop_reasons"], rid
        assert one["sampler"] == four["sampler"], rid  # every per-row counter, step for step
        a, sr_a = sf.read(str(wav_path(tmp_path / "b1", rid)), dtype="float32")
        b, sr_b = sf.read(str(wav_path(tmp_path / "b4", rid)), dtype="float32")
        assert sr_a == sr_b == 24000 and a.shape == b.shape and a.size > 0, rid
        np.testing.assert_allclose(b, a, atol=2e-5, rtol=0, err_msg=rid)
        lengths.add(a.size)
    assert len(lengths) > 1  # the rows really were of different lengths inside the batch
