"""``cosyclone say``, the Python API and ``--version`` on a tiny model: the same engine as synth.

The API and the CLI must give byte-identical audio for the same rows in the same batch (PCM16 WAV
bytes, same seed), which holds only if the API is a layer over the one pipeline, not a second
wiring of it; a row run alone matches its batched self up to the batch's float rounding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner, Result

from cosyclone import __version__
from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from tests.pcm16 import assert_same_pcm16_up_to_rounding

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
PROMPT = ROOT / "manifests" / "prompts" / "speaker1.wav"
FAST = {"max_tokens": 6, "n_timesteps": 2}  # a few tokens, two flow steps: the tiny model in seconds
FAST_ARGS = ["--max-tokens", "6", "--n-timesteps", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def tts(tiny_model_dir: Path):
    from cosyclone import CosyClone

    return CosyClone(tiny_model_dir, device="cpu", **FAST)


def say(model_dir: Path, out: Path, *extra: str, text: str = "Hello there, how are you?",
        prompt: Path = PROMPT) -> Result:
    return runner.invoke(app, ["say", text, "--prompt-audio", str(prompt), "--model-dir", str(model_dir),
                               "-o", str(out), *FAST_ARGS, *extra])


def test_version_prints_the_package_version() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"cosyclone {__version__}"


def test_say_writes_a_24k_wav_and_prints_its_diagnostics(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    res = say(tiny_model_dir, out, "--prompt-text", "reference words", "--seed", "11")
    assert res.exit_code == 0, res.output
    info = sf.info(str(out))
    assert (info.samplerate, info.channels, info.subtype) == (24000, 1, "PCM_16")
    data, _ = sf.read(str(out))
    assert len(data) > 0 and np.isfinite(data).all() and np.abs(data).max() > 0
    assert f"wrote {out}" in res.stdout and "seed 11" in res.stdout and "tokens [" in res.stdout
    tokens = json.loads(res.stdout.split("tokens ", 1)[1].split("]", 1)[0] + "]")
    assert len(data) == sum(tokens) * 2 * 480  # 2 mel frames per token, 480 samples per frame


def test_api_say_and_synth_give_byte_identical_audio(tts, tiny_model_dir: Path, tmp_path: Path) -> None:
    from cosyclone.folder.audio_out import AudioOutput
    from cosyclone.folder.writer import write_audio_atomic

    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows: list[dict[str, Any]] = [
        {
            "id": "seeded",
            "prompt_audio": "prompts/speaker1.wav",
            "prompt_text": "reference words",
            "text": "Hello there, how are you?",
            "seed": 5,
        },
        {
            "id": "derived",
            "prompt_audio": "prompts/speaker2.wav",
            "text": "Bonjour tout le monde.",
            "mode": "cross_lingual",
        },
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["synth", str(manifest), "--model-dir", str(tiny_model_dir), "--out",
                              str(tmp_path / "out"), *FAST_ARGS])
    assert res.exit_code == 0, res.output
    cli = {r["id"]: wav_path(tmp_path / "out", r['id']).read_bytes() for r in rows}

    # the run's files carry its provenance statement: the API's audio written with it gives the same bytes
    last_run = json.loads((tmp_path / "out" / "summary.json").read_text())["last_run"]
    statement = last_run["provenance"]["statement"]
    results = tts.synthesize_rows(rows, base=tmp_path)
    assert [r.id for r in results] == ["seeded", "derived"] and all(r.ok for r in results)
    for r in results:
        assert r.sample_rate == 24000 and r.audio is not None and r.audio.dtype == np.float32
        path = tmp_path / "api" / f"{r.id}.wav"
        output = AudioOutput(encoding="pcm16", tag=statement)
        write_audio_atomic(path, r.audio, model_rate=r.sample_rate, output=output)
        assert path.read_bytes() == cli[r.id], r.id

    one = tts.synthesize("Hello there, how are you?", prompt_audio=tmp_path / "prompts" / "speaker1.wav",
                         prompt_text="reference words", seed=5, id="seeded")
    assert one.seed == 5 and one.tokens == results[0].tokens
    write_audio_atomic(
        tmp_path / "one.wav", one.audio, model_rate=one.sample_rate, output=AudioOutput(encoding="pcm16")
    )
    # alone, not in a batch of two: the same tokens, and the batch's float rounding at most
    assert_same_pcm16_up_to_rounding(tmp_path / "one.wav", wav_path(tmp_path / "out", "seeded"))
    # say derives the seed from the output's file stem as synth derives it from the id
    assert (
        say(
            tiny_model_dir,
            tmp_path / "derived.wav",
            "--mode",
            "cross_lingual",
            text="Bonjour tout le monde.",
            prompt=tmp_path / "prompts" / "speaker2.wav",
        ).exit_code
        == 0
    )  # the row's prompt
    assert_same_pcm16_up_to_rounding(tmp_path / "derived.wav", wav_path(tmp_path / "out", "derived"))


def test_cross_lingual_without_prompt_text_validates_and_runs(
    tts, tiny_model_dir: Path, tmp_path: Path
) -> None:
    r = tts.synthesize("Bonjour.", prompt_audio=PROMPT, mode="cross_lingual")
    assert r.ok and r.error is None and r.tokens
    res = say(tiny_model_dir, tmp_path / "x.wav", "--mode", "cross_lingual", text="Bonjour.")
    assert res.exit_code == 0, res.output
    res = say(tiny_model_dir, tmp_path / "y.wav", text="Bonjour.")  # zero_shot reads the transcript
    assert res.exit_code == 2 and "--prompt-text: zero_shot needs the prompt's transcript" in res.stderr
    assert not (tmp_path / "y.wav").exists()


def test_nothing_to_speak_is_refused_with_its_line(tts, tmp_path: Path) -> None:
    from cosyclone.errors import CosycloneError, ManifestError

    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows = [{"id": "ok", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": "Hello."},
            {"id": "emoji", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual",
             "text": "😀🎉😀"},
            {"id": "dots", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": "..."}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    res = runner.invoke(app, ["validate", str(manifest)])
    assert res.exit_code == 3
    assert "line 2, id 'emoji', field 'text': text has nothing to speak" in res.stdout
    assert "line 3, id 'dots', field 'text': text has nothing to speak" in res.stdout
    with pytest.raises(CosycloneError, match=r"line 2, id 'emoji', field 'text'.*line 3, id 'dots'"):
        tts.synthesize_rows(rows, base=tmp_path)
    with pytest.raises(ManifestError, match="nothing to speak"):
        tts.synthesize("😀", prompt_audio=PROMPT, mode="cross_lingual")


def test_say_errors_name_the_option(tiny_model_dir: Path, tmp_path: Path) -> None:
    res = say(tiny_model_dir, tmp_path / "x.wav", "--mode", "cross_lingual", text="😀😀")
    assert res.exit_code == 2 and "error: TEXT: text has nothing to speak" in res.stderr
    res = runner.invoke(app, ["say", "Hi.", "--prompt-audio", str(PROMPT.parent), "--mode", "cross_lingual",
                              "--model-dir", str(tiny_model_dir), "-o", str(tmp_path / "x.wav")])
    assert res.exit_code == 2 and "is a directory, not an audio file" in res.stderr
    res = say(tiny_model_dir, tmp_path / "x.wav", "--top-p", "0", "--mode", "cross_lingual")
    assert res.exit_code == 2 and "--top-p" in res.output
    res = runner.invoke(app, ["say", "Hi.", "--prompt-audio", str(PROMPT), "--mode", "cross_lingual",
                              "-o", str(tmp_path / "x.wav")], env={"COSYCLONE_MODEL_DIR": ""})
    assert res.exit_code == 2 and "COSYCLONE_MODEL_DIR" in res.stderr


def test_model_dir_defaults_to_the_environment(tiny_model_dir: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["say", "Bonjour.", "--prompt-audio", str(PROMPT), "--mode", "cross_lingual",
                              "-o", str(tmp_path / "env.wav"), *FAST_ARGS],
                        env={"COSYCLONE_MODEL_DIR": str(tiny_model_dir)})
    assert res.exit_code == 0, res.output
    assert sf.info(str(tmp_path / "env.wav")).samplerate == 24000


def test_length_ratios_reach_the_decoder(tiny_model_dir: Path) -> None:
    from cosyclone import CosyClone

    fixed = CosyClone(tiny_model_dir, device="cpu", n_timesteps=2, min_len_ratio=1.0, max_len_ratio=1.0)
    text = "Hello there, how are you today?"
    plan = fixed.stages.frontend.text.plan("cross_lingual", None, text, None)
    r = fixed.synthesize(text, prompt_audio=PROMPT, mode="cross_lingual")
    n = len(plan.segments[0].ids)
    assert len(plan.segments) == 1 and n > 1
    seg = r.sampler[0]
    assert r.stop_reasons == ("max_len",) and seg.tokens_emitted == n  # exactly int(1 x n)
    assert seg.min_len_suppressed >= 0


def test_synth_records_sampler_options_and_threads(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch

    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        json.dumps(
            {"id": "a", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": "Hello."}
        )
        + "\n"
    )
    before = torch.get_num_threads()
    try:
        res = runner.invoke(app, ["synth", str(manifest), "--model-dir", str(tiny_model_dir), "--out",
                                  str(tmp_path / "out"), *FAST_ARGS, "--top-k", "5", "--top-p", "0.5",
                                  "--win-size", "4", "--tau-r", "0.2", "--min-len-ratio", "0",
                                  "--max-len-ratio", "3", "--threads", "1"])
        assert res.exit_code == 0, res.output
        assert torch.get_num_threads() == 1
    finally:
        from cosyclone.base.device import set_threads
        from cosyclone.frontend.onnx import set_intra_op_threads

        set_threads(before)
        set_intra_op_threads(1)
    opts = json.loads((tmp_path / "out" / "summary.json").read_text())["last_run"]["options"]
    assert (opts["top_k"], opts["top_p"], opts["win_size"], opts["tau_r"]) == (5, 0.5, 4, 0.2)
    assert (opts["min_len_ratio"], opts["max_len_ratio"]) == (0.0, 3.0)
    res = runner.invoke(
        app, ["synth", str(manifest), "--dry-run", "--load-format", "dummy", "--threads", "0"]
    )
    assert res.exit_code == 2 and "--threads" in res.output


def test_threads_reach_the_onnx_sessions(tiny_model_dir: Path) -> None:
    from cosyclone.frontend.onnx import get_session, set_intra_op_threads

    try:
        set_intra_op_threads(2)
        sess = get_session(tiny_model_dir / "campplus.onnx", ["CPUExecutionProvider"])
        assert sess.get_session_options().intra_op_num_threads == 2
    finally:
        set_intra_op_threads(1)
    sess = get_session(tiny_model_dir / "campplus.onnx", ["CPUExecutionProvider"])
    assert sess.get_session_options().intra_op_num_threads == 1  # upstream's default, its own session


def test_the_api_runs_the_engine_synth_runs(tts) -> None:
    """CosyClone is a facade: its rows go through the one Engine, whose typed results carry the audio
    (and nothing of a folder: the engine knows no file layout)."""
    rows = tts.validate(
        [{"id": "a", "prompt_audio": str(PROMPT), "mode": "cross_lingual", "text": "Hi there."}]
    )
    results = list(tts.engine.run(rows))
    assert [r.id for r in results] == ["a"] and results[0].audio is not None and results[0].ok
    assert not hasattr(results[0], "file") and not hasattr(results[0], "wav")
    assert np.array_equal(results[0].audio, tts.synthesize_rows(rows)[0].audio)
