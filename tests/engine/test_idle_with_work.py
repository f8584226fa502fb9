"""Where the time went, on the tiny model: a run with a distinct prompt per row and one prompt worker
keeps the talker stepping whenever it holds rows (idle-with-work at most 5% of its busy seconds),
and the run record names the stage that bounds it."""

from __future__ import annotations

import shutil
from pathlib import Path

from cosyclone.engine import Engine
from cosyclone.manifest import rows_from_dicts
from cosyclone.options import RunOptions

ROOT = Path(__file__).resolve().parents[2]


def test_the_talker_never_idles_with_rows_in_its_slots(tiny_model_dir: Path, tmp_path: Path) -> None:
    speakers = sorted((ROOT / "manifests" / "prompts").glob("speaker*.wav"))
    rows = []
    for i in range(8):  # a distinct prompt file per row: each is computed on the one prompt worker
        prompt = tmp_path / f"p{i}.wav"
        shutil.copy(speakers[i % len(speakers)], prompt)
        rows.append({"id": f"r{i}", "prompt_audio": str(prompt), "prompt_text": "reference words",
                     "text": f"Sentence number {i} is spoken here."})
    engine = Engine.load(tiny_model_dir, RunOptions(device="cpu", max_tokens=24, min_tokens=24, n_timesteps=1,
                                                    batch_size=2, frontend_workers=1, code2wav_thread=True))
    out = list(engine.run(rows_from_dicts(rows).rows))
    assert len(out) == 8 and all(r.ok for r in out)
    seconds = engine.facts().stages
    assert seconds.talker.busy > 0 and seconds.bound_by is not None
    assert seconds.talker_idle_with_work <= 0.05 * seconds.talker.busy, seconds
    assert engine.facts().as_record()["stages"]["talker_idle_with_work"] == seconds.talker_idle_with_work
