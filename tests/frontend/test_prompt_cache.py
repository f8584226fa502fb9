"""The prompt-conditioning cache: a manifest that reuses two prompts runs each prompt's ONNX models
once, and writes byte-identical WAVs and records to a run with the cache switched off."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.engine import Engine
from cosyclone.frontend.onnx import OnnxModels
from cosyclone.frontend.prompt_cache import LRUCache, audio_digest
from cosyclone.options import RunOptions
from cosyclone.run.job import SynthJob
from tests.run_folders import diags, wav_bytes

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Hello there.", "A longer sentence, with a comma in it.", "Short.", "One more line to speak.",
         "Numbers like 42 get read.", "The end."]


def _manifest(folder: Path) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    # speaker2 also under a second name: the cache keys on content, so the copy is a hit
    shutil.copy(folder / "prompts" / "speaker2.wav", folder / "prompts" / "copy_of_2.wav")
    audio = ["prompts/speaker1.wav", "prompts/speaker2.wav", "prompts/copy_of_2.wav"]
    rows = [{"id": f"row{i}", "prompt_audio": audio[i % 3], "prompt_text": "reference words",
             "text": text} for i, text in enumerate(TEXTS)]
    path = folder / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spy(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, int]]:
    """Count the ONNX calls per model and per distinct prompt (by its 16 kHz wave's length)."""
    calls: Counter[tuple[str, int]] = Counter()
    for name in ("speech_tokens", "speaker_embedding"):
        real = getattr(OnnxModels, name)

        def spy(self: OnnxModels, wave16: torch.Tensor, _real=real, _name=name) -> torch.Tensor:
            calls[(_name, int(wave16.numel()))] += 1
            return _real(self, wave16)

        monkeypatch.setattr(OnnxModels, name, spy)
    return calls


def _run(manifest: Path, model_dir: Path, out: Path) -> dict[str, dict]:
    res = CliRunner().invoke(
        app,
        [
            "synth",
            str(manifest),
            "--model-dir",
            str(model_dir),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--n-timesteps",
            "2",
            "--batch-size",
            "4",
            "--seed",
            "3",
        ],
    )
    assert res.exit_code == 0, res.output
    return diags(out)


def test_cache_hits_give_byte_identical_wavs_and_run_onnx_once_per_prompt(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = _manifest(tmp_path)
    calls = _spy(monkeypatch)
    cached = _run(manifest, tiny_model_dir, tmp_path / "cached")
    assert len(calls) == 4 and set(calls.values()) == {1}, calls  # 2 distinct prompts x 2 models, once each

    calls.clear()
    engine = Engine.load(tiny_model_dir, RunOptions(device="cpu", n_timesteps=2))
    engine.stages.frontend.prompt_cache = LRUCache(0)  # this run's frontend caches no prompt's features
    SynthJob.open(manifest, tmp_path / "plain", loaded=engine, device="cpu", n_timesteps=2, batch_size=4,
                  seed=3).run()
    plain = diags(tmp_path / "plain")
    # no content cache: the prompt workers still prepare each prompt file once for the rows ahead,
    # but the copy under another name is encoded again (3 files x 2 models)
    assert len(calls) == 4 and sum(calls.values()) == 2 * 3, calls

    assert set(cached) == set(plain) == {f"row{i}" for i in range(len(TEXTS))}
    for rid, want in plain.items():
        got = cached[rid]
        assert got["status"] == want["status"] == "ok", rid
        assert got["tokens"] == want["tokens"] and got["sampler"] == want["sampler"], rid
    a, b = wav_bytes(tmp_path / "cached"), wav_bytes(tmp_path / "plain")
    assert a == b and len(a) == len(TEXTS) and all(len(x) > 44 for x in a.values())


def test_lru_evicts_least_recent_and_stores_no_failure() -> None:
    cache: LRUCache[int] = LRUCache(2)
    assert cache.get_or_compute("a", lambda: 1) == 1
    assert cache.get_or_compute("b", lambda: 2) == 2
    assert cache.get_or_compute("a", lambda: 99) == 1  # hit: "a" becomes the most recent
    assert cache.get_or_compute("c", lambda: 3) == 3  # evicts "b"
    assert cache.get_or_compute("b", lambda: 4) == 4
    with pytest.raises(ZeroDivisionError):
        cache.get_or_compute("d", lambda: 1 // 0)
    assert cache.get_or_compute("d", lambda: 5) == 5  # the failure was not stored
    assert cache.stats() == {"hits": 1, "misses": 6, "entries": 2}


def test_digest_is_of_content_not_name(tmp_path: Path) -> None:
    src = ROOT / "manifests" / "prompts" / "speaker1.wav"
    copy = tmp_path / "other_name.wav"
    shutil.copy(src, copy)
    assert (
        audio_digest(src)
        == audio_digest(copy)
        != audio_digest(ROOT / "manifests" / "prompts" / "speaker2.wav")
    )
    wave = torch.randn(1600)
    assert audio_digest((wave, 16000)) == audio_digest((wave.clone(), 16000)) != audio_digest((wave, 24000))


def test_a_missing_prompt_fails_with_the_loaders_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    from cosyclone.errors import CosycloneError
    from cosyclone.frontend import Frontend
    from cosyclone.model.config import load_model_config

    fe = Frontend(load_model_config(tiny_model_dir))
    with pytest.raises(CosycloneError, match="row7"):
        fe.prompt_features(tmp_path / "gone.wav", row_id="row7")
    assert fe.cache_stats()["prompt_audio"]["entries"] == 0
