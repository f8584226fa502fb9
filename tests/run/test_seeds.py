"""A manifest seed means what it says, through the real CLI on a tiny model: a row with "seed": 123
reports 123 (row record and every segment's sampler entry, with the segment index), its segments
draw different noise, and the row reproduces run alone and inside a batch: the same tokens and
sampler counters, and the same PCM16 audio up to the batch's float rounding (tests/pcm16.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from cosyclone.talker.sampler import row_seed
from tests.pcm16 import assert_same_pcm16_up_to_rounding
from tests.run_folders import ROOT, diags

# two sentences long enough for the tiny frontend to cut the text into two segments
TWO_SEGMENTS = "Hello there. This is a test of the splitter. " * 4
PINNED = {"id": "pinned", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words",
          "text": TWO_SEGMENTS, "seed": 123}
OTHERS = [
    {
        "id": f"o{i}",
        "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
        "prompt_text": "other words " * (i + 1),
        "text": "another text " * (i + 1),
    }
    for i in range(3)
]


def _synth(folder: Path, model_dir: Path, rows: list[dict], name: str, batch: int) -> Path:
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = folder / name
    res = CliRunner().invoke(app, ["synth", str(path), "--model-dir", str(model_dir), "--out", str(out),
                                   "--device", "cpu", "--max-tokens", "6", "--n-timesteps", "2",
                                   "--batch-size", str(batch), "--seed", "5"])
    assert res.exit_code == 0, res.output
    return out


def test_manifest_seed_is_reported_and_reproduces_alone_and_in_a_batch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    alone = _synth(tmp_path, tiny_model_dir, [PINNED], "alone", 1)
    batch = _synth(tmp_path, tiny_model_dir, [OTHERS[0], PINNED, *OTHERS[1:]], "batch", 4)

    a, b = diags(alone)["pinned"], diags(batch)["pinned"]
    assert a["seed"] == b["seed"] == 123
    assert [(s["seed"], s["segment"]) for s in a["sampler"]] == [(123, 0), (123, 1)]
    assert a["tokens"] == b["tokens"] and a["stop_reasons"] == b["stop_reasons"]
    assert a["sampler"] == b["sampler"]  # every counter of both segments
    # the same tokens; a batch of 4 rounds the flow and HiFT differently
    assert_same_pcm16_up_to_rounding(wav_path(alone, "pinned"), wav_path(batch, "pinned"))
    assert wav_path(alone, "pinned").stat().st_size > 1000

    for other in OTHERS:  # rows without a manifest seed: --seed combined with the id, reported once
        d = diags(batch)[other["id"]]
        assert d["seed"] == row_seed(5, other["id"]) and {s["seed"] for s in d["sampler"]} == {d["seed"]}
