"""One engine behind every door: the API, ``say`` and ``synth`` resolve and record the same options, and a
loaded model shared by several runs keeps no run's state (the stage-0 token checkpoint is the run's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.engine.setup import recorded_options
from tests.run_folders import ROOT

PROMPT = ROOT / "manifests" / "prompts" / "speaker1.wav"
FAST = ["--max-tokens", "6", "--n-timesteps", "2", "--device", "cpu"]


def _manifest(folder: Path, text: str) -> Path:
    path = folder / "m.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt_audio": str(PROMPT), "prompt_text": "reference words",
                                "text": text}) + "\n")
    return path


def test_a_reused_model_gives_a_changed_text_under_a_reused_id_what_a_fresh_one_gives(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosyclone import CosyClone
    from cosyclone.engine import stages

    tts = CosyClone(tiny_model_dir, device="cpu", max_tokens=6, n_timesteps=2)

    def broken(*args, **kwargs):
        raise RuntimeError("code2wav down")

    # the folder run fails after the talker: row a's tokens stay in its folder
    with monkeypatch.context() as m:
        m.setattr(stages, "_code2wav", broken)
        summary = tts.synth_folder(_manifest(tmp_path, "the first text of row a"), tmp_path / "out")
    assert summary.last_run.failed == 1
    assert list((tmp_path / "out" / ".cosyclone" / "tokens").glob("*.cch"))
    changed = {"id": "a", "prompt_audio": str(PROMPT), "prompt_text": "reference words",
               "text": "another text entirely, under the same id"}
    reused = tts.synthesize_rows([changed])[0]
    fresh = CosyClone(tiny_model_dir, device="cpu", max_tokens=6, n_timesteps=2).synthesize_rows([changed])[0]
    assert reused.ok and fresh.ok
    assert reused.tokens == fresh.tokens
    assert np.array_equal(reused.audio, fresh.audio)


def test_say_the_api_and_synth_record_the_same_resolved_options(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import cosyclone.api as api

    made: list = []
    real_init = api.CosyClone.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(api.CosyClone, "__init__", spy)
    flags = [*FAST, "--top-k", "7", "--model-dir", str(tiny_model_dir)]
    res = CliRunner().invoke(app, ["say", "Hello there.", "--prompt-audio", str(PROMPT), "--prompt-text",
                                   "reference words", "-o", str(tmp_path / "say.wav"), *flags])
    assert res.exit_code == 0, res.output
    say_options = recorded_options(made[0].options, made[0].cfg)  # as a run records them
    loaded = api.CosyClone(tiny_model_dir, device="cpu", max_tokens=6, n_timesteps=2, top_k=7)
    api_options = recorded_options(loaded.options, loaded.cfg)
    res = CliRunner().invoke(
        app,
        ["synth", str(_manifest(tmp_path, "Hello there.")), "--out", str(tmp_path / "o"), "--quiet", *flags],
    )
    assert res.exit_code == 0, res.output
    synth_options = json.loads((tmp_path / "o" / "summary.json").read_text())["last_run"]["options"]
    assert say_options == api_options == synth_options
    # resolved, never "auto"
    assert synth_options["cuda_graphs"] == "off" and synth_options["device"] == "cpu"
    assert synth_options["top_k"] == 7
