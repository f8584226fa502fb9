"""Eval without models: normalization and WER/CER, signal checks, the folder reader, thresholds, redo seeds,
summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cosyclone.eval.audio_checks import check_audio
from cosyclone.eval.deps import EvalDependencyError, require
from cosyclone.eval.folder import NOT_SYNTHESIZED, SYNTH_FAILED, WAV_MISSING, read_folder
from cosyclone.eval.metrics import infer_language
from cosyclone.eval.redo import redo_line, redo_seed
from cosyclone.eval.summary import eval_summary_renderable, load_eval_summary, stats, summarize, write_summary
from cosyclone.eval.thresholds import Thresholds, failures
from cosyclone.manifest import read_manifest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "eval_espeak"


def _needs(module: str):
    return pytest.importorskip(module, reason=f"the eval extra is not installed ({module}): "
                                              "pip install -e '.[eval]'")


# --------------------------------------------------------------------------------------------- text


def test_language_comes_from_a_tag_or_the_script_else_is_left_to_the_asr():
    assert infer_language("<|en|>Hello there") == ("en", "tag")
    assert infer_language("<|jp|>こんにちは") == ("ja", "tag")
    assert infer_language("你好，世界") == ("zh", "text")
    assert infer_language("漢字とひらがな") == ("ja", "text")  # kana decides between ja and zh
    assert infer_language("안녕하세요") == ("ko", "text")
    assert infer_language("Bonjour tout le monde.") == (None, "unknown")


def test_english_normalization_folds_case_punctuation_and_numbers():
    _needs("inflect")
    from cosyclone.eval.metrics import normalize

    assert normalize("There are 12 eggs!", "en") == normalize("there are TWELVE eggs", "en") == \
        "there are twelve eggs"
    assert normalize("1,234 people", "en") == "one thousand two hundred thirty four people"
    assert (
        normalize("the 21st time, 3.5% more", "en") == "the twenty first time three point five percent more"
    )
    assert normalize("Don't stop\u2014now. It\u2019s Sam's.", "en") == "don't stop now it's sam's"
    assert normalize("<|en|>Hello [breath] <strong>world</strong>", "en") == "hello world"


def test_chinese_and_japanese_are_scored_on_characters():
    _needs("jiwer")
    _needs("inflect")
    from cosyclone.eval.metrics import normalize, score

    assert normalize("你好，世界！ 12", "zh") == "你好世界12"  # no number spelling outside English
    s = score("你好，世界！", "你好世", "zh")
    assert s.metric == "cer" and s.wer is None
    assert s.cer == pytest.approx(0.25) and s.error_rate == s.cer
    assert score("こんにちは。", "こんにちは", "ja").error_rate == 0.0


def test_wer_cer_and_similarity_ratio_of_an_english_row():
    _needs("jiwer")
    _needs("inflect")
    from cosyclone.eval.metrics import score

    exact = score("There are 12 eggs.", " There are twelve eggs", "en")
    assert (exact.wer, exact.cer, exact.similarity_ratio) == (0.0, 0.0, 1.0)
    s = score("the cat sat", "the bat", None)
    assert s.metric == "wer" and s.wer == pytest.approx(2 / 3) and (s.ref_words, s.word_edits) == (3, 2)
    assert s.similarity_ratio is not None and 0.0 < s.similarity_ratio < 1.0
    empty = score("!!!", "hello", "en")  # nothing speakable: no rate, rather than a made-up 0 or 1
    assert empty.error_rate is None and empty.similarity_ratio is None


def test_a_missing_extra_names_the_pip_command():
    with pytest.raises(EvalDependencyError, match=r"pip install -e '\.\[eval\]'"):
        require("cosyclone_no_such_module", purpose="testing")


# --------------------------------------------------------------------------------------------- audio


def test_signal_checks_measure_silence_and_clipping():
    sr = 16000
    t = np.arange(sr) / sr
    tone = 0.5 * np.sin(2 * np.pi * 220 * t)
    wave = np.concatenate([np.zeros(sr // 2), tone, np.zeros(sr // 4)]).astype(np.float32)
    c = check_audio(wave, sr)
    assert c.duration_s == pytest.approx(1.75)
    assert c.lead_silence_s == pytest.approx(0.5, abs=0.011)
    assert c.trail_silence_s == pytest.approx(0.25, abs=0.011)
    assert not c.all_silent and c.clipped_samples == 0 and c.peak == pytest.approx(0.5, abs=1e-3)

    loud = np.clip(1.5 * np.sin(2 * np.pi * 220 * t), -1.0, 1.0).astype(np.float32)
    clipped = check_audio(loud, sr)
    assert clipped.clipped_samples > 0.3 * sr and clipped.clipped_fraction == clipped.clipped_samples / sr

    silent = check_audio(np.zeros(sr, np.float32), sr)
    assert silent.all_silent and silent.lead_silence_s == silent.trail_silence_s == pytest.approx(1.0)
    bad = tone.astype(np.float32)
    bad[:10] = np.nan
    assert check_audio(bad, sr).nonfinite_samples == 10


# --------------------------------------------------------------------------------------------- folder


def _folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "wavs").mkdir(parents=True)
    (tmp_path / "prompts").mkdir()
    sf.write(tmp_path / "prompts" / "p.wav", np.zeros(16000, np.float32), 16000)
    rows = [
        {"id": i, "prompt_audio": "prompts/p.wav", "prompt_text": "words", "text": "hello", **extra}
        for i, extra in (("ok1", {"seed": 3}), ("retried", {}), ("failed", {}), ("nowav", {}), ("todo", {}))
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "bad"}\n')
    for rid in ("ok1", "retried"):
        sf.write(out / "wavs" / f"{rid}.wav", np.zeros(800, np.float32), 24000)
    lines = [{"id": "ok1", "status": "ok", "seed": 3}, {"id": "retried", "status": "failed", "seed": 9},
             {"id": "failed", "status": "failed", "error": "talker: no_finite_logits", "seed": 1},
             {"id": "retried", "status": "ok", "seed": 42}, {"id": "nowav", "status": "ok", "seed": 5},
             {"id": "stranger", "status": "ok"}]
    text = "".join(json.dumps(x) + "\n" for x in lines[:3]) + '{"id": "torn", "sta\n' + \
        "".join(json.dumps(x) + "\n" for x in lines[3:])
    (out / "diagnostics.jsonl").write_text(text)
    return out


def test_the_folder_is_read_from_manifest_wavs_and_the_last_diagnostics_line(tmp_path: Path):
    out = _folder(tmp_path)
    folder = read_folder(out, tmp_path / "m.jsonl")
    state = {f.row.id: f.skip for f in folder.rows}
    assert state == {"ok1": None, "retried": None, "failed": SYNTH_FAILED, "nowav": WAV_MISSING,
                     "todo": NOT_SYNTHESIZED}
    by_id = {f.row.id: f for f in folder.rows}
    assert by_id["retried"].seed == 42  # the last line wins: the WAV on disk is the ok retry's
    assert len(folder.invalid) == 1 and folder.invalid[0].line == 6
    assert folder.unknown_ids == ["stranger"]


def test_redo_lines_keep_the_row_make_the_prompt_absolute_and_step_the_seed(tmp_path: Path):
    out = _folder(tmp_path)
    folder = read_folder(out, tmp_path / "m.jsonl")
    frow = next(f for f in folder.rows if f.row.id == "retried")
    line = redo_line(frow)
    assert line["seed"] == redo_seed("retried", 42) != 42
    assert Path(line["prompt_audio"]).is_absolute() and Path(line["prompt_audio"]).is_file()
    assert {k: v for k, v in line.items() if k not in ("seed", "prompt_audio")} == \
        {k: v for k, v in frow.raw.items() if k not in ("seed", "prompt_audio")}
    # written into OUT, the line is a valid manifest row pointing at the same prompt
    (out / "r.jsonl").write_text(json.dumps(line) + "\n")
    again = read_manifest(out / "r.jsonl")
    assert not again.errors and again.rows[0].prompt_audio == frow.row.prompt_audio.resolve()


def test_redo_seeds_are_deterministic_new_at_every_attempt_and_per_row():
    chain = [7]
    for _ in range(5):
        chain.append(redo_seed("row", chain[-1]))
    assert len(set(chain)) == 6 and all(0 <= s < 2**63 for s in chain)
    assert redo_seed("row", 7) == chain[1]  # same inputs, same seed: eval twice writes the same file
    assert redo_seed("other", 7) != chain[1]


# --------------------------------------------------------------------------------------------- judging


def test_thresholds_fail_rows_past_them_and_rows_without_the_metric():
    rec = {"metric": "wer", "error_rate": 0.3, "speaker_similarity": {"resemblyzer": 0.6},
           "lead_silence_s": 0.1, "trail_silence_s": 1.5, "clipped_fraction": 0.0}
    t = Thresholds(max_wer=0.2, min_similarity=0.7, max_silence_s=1.0, max_clipped_fraction=0.01)
    assert set(failures(rec, t, "resemblyzer")) == {"error_rate", "speaker_similarity", "silence"}
    assert failures(rec, Thresholds(max_wer=0.5, min_similarity=0.5), "resemblyzer") == {}
    assert set(failures({**rec, "error_rate": None}, Thresholds(max_wer=0.5), None)) == {"error_rate"}
    assert failures(rec, Thresholds(), "resemblyzer") == {}


def test_summary_statistics_threshold_counts_and_round_trip(tmp_path: Path):
    assert stats([1.0, 2.0, 3.0, 4.0])["p50"] == 2.5 and stats([])["mean"] is None
    t = Thresholds(max_wer=0.2)
    recs = []
    for i, er in enumerate((0.0, 0.1, 0.4, 0.9)):
        r = {"id": f"r{i}", "status": "ok", "metric": "wer", "wer": er, "error_rate": er, "cer": er / 2,
             "similarity_ratio": 1.0 - er, "ref_words": 10, "word_edits": int(er * 10), "ref_chars": 40,
             "char_edits": int(er * 20), "speaker_similarity": {"resemblyzer": 0.8}, "language": "en",
             "duration_s": 2.0, "lead_silence_s": 0.1, "trail_silence_s": 0.2, "clipped_fraction": 0.0}
        r["fails"] = failures(r, t, "resemblyzer")
        recs.append(r)
    recs.append({"id": "gone", "status": "skipped", "skip_reason": SYNTH_FAILED})
    s = summarize(recs, thresholds=t, backend="resemblyzer", extra={})
    assert (s["rows"], s["scored"], s["failing"], s["skipped"]) == (5, 4, 2, {SYNTH_FAILED: 1})
    assert s["over_threshold"] == {"error_rate > 0.2": 2} and s["flags"]["error_rate > 0.5"] == 1
    assert s["metrics"]["wer"]["mean"] == pytest.approx(0.35)
    assert s["pooled"]["wer"] == pytest.approx(14 / 40)
    write_summary(tmp_path, s)
    assert load_eval_summary(tmp_path) == json.loads(json.dumps(s))
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(eval_summary_renderable(s))
    shown = console.export_text()
    assert "4 of 5 rows scored" in shown and "error_rate > 0.2" in shown and "spk sim resemblyzer" in shown


def test_no_summary_reads_as_none(tmp_path: Path):
    assert load_eval_summary(tmp_path) is None
    (tmp_path / "eval_summary.json").write_text("{not json")
    assert load_eval_summary(tmp_path) is None
    (tmp_path / "eval_summary.json").write_text('{"format": 999}')
    assert load_eval_summary(tmp_path) is None


def test_the_committed_fixture_is_a_consistent_run_folder(tmp_path: Path):
    out = tmp_path / "fixture"  # a copy: reading a folder indexes it, and the committed one stays as it is
    shutil.copytree(FIXTURE, out)
    folder = read_folder(out, out / "manifest.jsonl")
    assert [f.skip for f in folder.rows] == [None] * 6 and not folder.invalid
    for f in folder.rows:
        info = sf.info(str(f.wav))
        assert (info.samplerate, info.channels) == (16000, 1) and 2.0 < info.duration < 5.0


def test_report_shows_the_eval_summary_beside_the_synthesis_totals(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cosyclone.cli import app

    (tmp_path / "diagnostics.jsonl").write_text(
        json.dumps(
            {"id": "r0", "status": "ok", "audio_seconds": 2.0, "sampler": [{"steps": 5, "nan_steps": 1}]}
        )
        + "\n"
        + json.dumps({"id": "r1", "status": "failed", "reason": "no_finite_logits", "sampler": []})
        + "\n"
    )
    rec = {"id": "r0", "status": "ok", "metric": "wer", "wer": 0.1, "error_rate": 0.1, "cer": 0.05,
           "similarity_ratio": 0.9, "ref_words": 10, "word_edits": 1, "ref_chars": 40, "char_edits": 2,
           "speaker_similarity": {"resemblyzer": 0.8}, "language": "en", "duration_s": 2.0,
           "lead_silence_s": 0.1, "trail_silence_s": 0.2, "clipped_fraction": 0.0}
    t = Thresholds(max_wer=0.2)
    rec["fails"] = failures(rec, t, "resemblyzer")
    write_summary(tmp_path, summarize([rec], thresholds=t, backend="resemblyzer", extra={}))
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert (got["rows"], got["done"], got["failed_reasons"]) == (2, 1, {"no_finite_logits": 1})
    assert got["sampler"]["rows_with_nan"] == 1 and got["eval"][str(tmp_path)]["scored"] == 1
    plain = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert "rows: 2" in plain.output and f"eval of {tmp_path}" in plain.output
