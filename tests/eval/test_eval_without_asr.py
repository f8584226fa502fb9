"""Eval with no ASR model: DNSMOS, speaking rate, silence, clipping and speaker similarity, and the
verdicts a training-set filter keeps (redo.jsonl, the export's columns).

The folder is written by the real writer (tests/run/test_export.py's helpers): the project's three
prompt recordings (espeak-ng speech, manifests/prompts/) as rows, and one row of white noise. Measured
on the development machine (AMD EPYC, 2 cores): DNSMOS OVRL 2.61..2.87 for the speech, 1.06 for
the noise (speechmos's own function gives the same to 1e-4: tests/eval/test_eval_dnsmos.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.engine import RowResult
from cosyclone.eval.redo import REDO_NAME
from cosyclone.export.build import export
from cosyclone.folder import layout as runfolder
from cosyclone.folder.row_record import RowStamp
from cosyclone.folder.settle import settle
from cosyclone.folder.writer import BackgroundWriter, WriterOptions
from cosyclone.manifest import read_manifest

pytest.importorskip("speechmos", reason="DNSMOS's models come with speechmos (the eval extra)")
pytest.importorskip("inflect", reason="the eval extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "manifests" / "prompts"
RATE = 24000
#: the prompt recordings' sentences (manifests/make_prompts.sh)
SAID = {"speaker1": "This is the reference speaker talking.", "speaker2": "I recorded this sentence for you.",
        "speaker3": "Good morning, my name is Sam and I live by the sea."}


def _at_rate(path: Path) -> np.ndarray:
    import torch

    from cosyclone.frontend.audio import resample

    wave, sr = sf.read(str(path), dtype="float32")
    return resample(torch.from_numpy(wave), sr, RATE).numpy().astype(np.float32)


def _write(out: Path, rows: list[tuple[str, str, np.ndarray]]) -> Path:
    """A run folder of ``rows`` (id, text, audio at RATE) through the real writer, and its manifest."""
    shutil.copytree(PROMPTS, out.parent / "prompts", dirs_exist_ok=True)
    writer = BackgroundWriter(WriterOptions(out_dir=out), runfolder.journal_path(out, "all"))
    lines = []
    try:
        for line, (rid, text, wave) in enumerate(rows, start=1):
            prompt = f"prompts/{rid if rid in SAID else 'speaker1'}.wav"
            stamp = RowStamp(fingerprint=None, fingerprint_parts=None, run_id="r", text=text,
                             prompt_text=SAID["speaker1"], prompt_audio=str(out.parent / prompt),
                             mode="zero_shot", instruct="", speed=1.0, manifest="m.jsonl", shard=None)
            writer.write_now(RowResult(id=rid, line=line, seed=100 + line, status="ok", audio=wave,
                                       audio_seconds=wave.size / RATE), stamp)
            lines.append({"id": rid, "text": text, "prompt_audio": prompt, "prompt_text": SAID["speaker1"],
                          "seed": 100 + line})
    finally:
        writer.close()
    settle(out, "all")
    manifest = out.parent / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return manifest


@pytest.fixture(scope="module")
def speech_and_noise(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("noise") / "out"
    rows = [(name, text, _at_rate(PROMPTS / f"{name}.wav")) for name, text in SAID.items()]
    noise = np.random.default_rng(5).uniform(-0.5, 0.5, 3 * RATE).astype(np.float32)
    rows.append(("noise", "This row should have been speech.", noise))
    return out, _write(out, rows)


def test_eval_without_asr_flags_the_noise_row_by_dnsmos_and_redoes_it(speech_and_noise) -> None:
    out, manifest = speech_and_noise
    res = CliRunner().invoke(app, ["eval", str(out), "--manifest", str(manifest), "--min-dnsmos", "2.0"])
    assert res.exit_code == 3, res.output  # a row fails a threshold
    assert res.output.count("WER/CER skipped") == 1
    lines = {x["id"]: x for x in map(json.loads, (out / "scores.jsonl").read_text().splitlines())}
    speech = [lines[name] for name in SAID]
    assert all(x["status"] == "ok" and x["wer"] is None and x["transcript"] is None for x in lines.values())
    assert min(x["dnsmos_ovrl"] for x in speech) > 2.3 and lines["noise"]["dnsmos_ovrl"] < 1.5
    assert all(1.0 <= x[k] <= 5.0 for x in lines.values() for k in ("dnsmos_sig", "dnsmos_bak",
                                                                     "dnsmos_p808"))
    assert set(lines["noise"]["fails"]) == {"dnsmos"} and not any(x["fails"] for x in speech)
    # speaker similarity needs no ASR either: each recording is its own row's prompt
    assert all(x["speaker_similarity"]["resemblyzer"] > 0.99 for x in speech)
    redo = read_manifest(out / REDO_NAME)
    assert [r.id for r in redo.rows] == ["noise"] and not redo.errors
    summary = json.loads((out / "scores_summary.json").read_text())
    assert summary["asr_skipped"] and summary["over_threshold"] == {"dnsmos_ovrl < 2": 1}
    assert summary["models"]["asr"] is None and len(summary["models"]["dnsmos"]["sha256"]) == 2


def test_dnsmos_columns_load_in_datasets_from_a_parquet_export(speech_and_noise) -> None:
    datasets = pytest.importorskip("datasets")
    out, manifest = speech_and_noise
    res = CliRunner().invoke(app, ["eval", str(out), "--manifest", str(manifest), "--speaker-model", "none"])
    assert res.exit_code == 0, res.output  # no thresholds: a report
    summary = export(out, fmt="parquet")
    files = sorted(str(p) for p in summary.to_dir.glob("*.parquet"))
    ds = datasets.load_dataset("parquet", data_files=files, split="train").select_columns(
        ["id", "eval_dnsmos_ovrl", "eval_dnsmos_sig", "eval_dnsmos_bak", "eval_dnsmos_p808",
         "eval_s_per_char"])
    by_id = {row["id"]: row for row in ds}
    scores = {x["id"]: x for x in map(json.loads, (out / "scores.jsonl").read_text().splitlines())}
    assert set(by_id) == set(scores)
    for rid, row in by_id.items():
        assert row["eval_dnsmos_ovrl"] == pytest.approx(scores[rid]["dnsmos_ovrl"])
        assert row["eval_dnsmos_p808"] == pytest.approx(scores[rid]["dnsmos_p808"])
    assert ds.features["eval_dnsmos_ovrl"].dtype == "float64"
    assert by_id["noise"]["eval_dnsmos_ovrl"] < 1.5 < by_id["speaker1"]["eval_dnsmos_ovrl"]


def _burst(seconds: float, seed: int) -> np.ndarray:
    """``seconds`` of a loud band of noise (no edge silence to trim), as a stand-in for speech."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def test_a_row_five_times_slower_per_character_is_flagged_without_asr(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    rows = []
    for i in range(12):
        text = "the quick brown fox jumps " * (1 + i % 3)
        chars = len(text.replace(" ", ""))
        rows.append((f"r{i:02d}", text, _burst(chars * 0.07 * rng.uniform(0.9, 1.1), i)))
    text = "the quick brown fox jumps "
    rows.append(("slow", text, _burst(len(text.replace(" ", "")) * 0.07 * 5, 99)))  # 5x its neighbours
    out = tmp_path / "out"
    manifest = _write(out, rows)
    args = ["eval", str(out), "--manifest", str(manifest), "--speaker-model", "none", "--no-dnsmos"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output  # flagged, but no threshold asked for it
    lines = {x["id"]: x for x in map(json.loads, (out / "scores.jsonl").read_text().splitlines())}
    assert {rid for rid, x in lines.items() if x["rate_outlier"]} == {"slow"}
    slow = lines["slow"]
    assert slow["rate_outlier"] == "slow" and slow["s_per_char"] > slow["rate_fences"][1]
    assert slow["rate_group"] == "unknown" and slow["rate_chars"] == 21 and slow["dnsmos_ovrl"] is None
    assert json.loads((out / "scores_summary.json").read_text())["flags"][
        "speaking rate outside its language's fences"] == 1
    res = CliRunner().invoke(app, [*args, "--rate-outliers"])
    assert res.exit_code == 3, res.output  # now a threshold: the row fails and is redone
    assert [r.id for r in read_manifest(out / REDO_NAME).rows] == ["slow"]
    assert "speaking_rate" in json.loads((out / "scores.jsonl").read_text().splitlines()[-1])["fails"]


def test_thresholds_without_their_model_are_refused_naming_the_option(speech_and_noise) -> None:
    out, manifest = speech_and_noise
    base = ["eval", str(out), "--manifest", str(manifest), "--speaker-model", "none"]
    res = CliRunner().invoke(app, [*base, "--max-wer", "0.2"])
    assert res.exit_code == 2 and "--max-wer needs --asr-model" in res.output
    res = CliRunner().invoke(app, [*base, "--no-dnsmos", "--min-dnsmos", "3"])
    assert res.exit_code == 2 and "--min-dnsmos needs DNSMOS" in res.output
