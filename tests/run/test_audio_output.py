"""The folder as training stacks take it: another rate and FLAC through a real synth run (the tiny
model), loaded by ``datasets``' audiofolder; a rerun at another output redoes every row; the trim is
recorded; export reads the same rows back."""

from __future__ import annotations

import json
from pathlib import Path

import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from tests.run_folders import ROOT

FAST = ["--max-tokens", "12", "--n-timesteps", "2", "--device", "cpu", "--quiet"]
MANIFEST = ROOT / "manifests" / "example.jsonl"


def _synth(model: Path, out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(app, ["synth", str(MANIFEST), "--model-dir", str(model), "--out", str(out),
                                   *FAST, *extra])
    assert res.exit_code == 0, res.output
    return json.loads((out / "summary.json").read_text())["last_run"]


def _records(out: Path) -> dict[str, dict]:
    return {d["id"]: d for d in map(json.loads, (out / "diagnostics.jsonl").read_text().splitlines())}


def test_a_16k_flac_folder_loads_as_an_audiofolder_and_a_default_rerun_redoes_every_row(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    import datasets

    out = tmp_path / "out"
    first = _synth(tiny_model_dir, out, "--sample-rate", "16000", "--audio-format", "flac")
    assert (
        first["done"] == 4
        and first["output"]["sample_rate"] == 16000
        and first["output"]["audio_format"] == "flac"
    )
    recs = _records(out)
    for rid, rec in recs.items():
        path = wav_path(out, rid, ".flac")
        info = sf.info(str(path))
        assert (rec["file"], rec["sample_rate"], rec["audio_format"], rec["encoding"]) == (
            path.relative_to(out).as_posix(), 16000, "flac", "pcm16")
        assert info.format == "FLAC" and info.samplerate == 16000 and info.frames == rec["samples"]
        # the model's 24 kHz samples resampled: a third fewer
        assert rec["samples"] == round(rec["audio_seconds"] * 16000)
    assert not list((out / "wavs").rglob("*.wav"))
    ds = datasets.load_dataset("audiofolder", data_dir=str(out), split="train")
    assert len(ds) == 4 and {r["id"] for r in ds} == set(recs)
    assert all(r["audio"]["sampling_rate"] == 16000 for r in ds)

    again = _synth(tiny_model_dir, out)  # the default output: another file for every row
    assert again["done"] == 4 and again["skipped"] == 0 and again["redone"] == 4
    assert again["redone_by"] == {"options": 4}
    recs = _records(out)
    assert all(
        r["file"] == wav_path(out, rid).relative_to(out).as_posix() and r["sample_rate"] == 24000
        for rid, r in recs.items()
    )
    assert not list((out / "wavs").rglob("*.flac"))  # the FLAC of the earlier output is gone with its record
    assert _synth(tiny_model_dir, out)["skipped"] == 4  # and now it resumes


def test_trim_silence_records_the_seconds_cut_at_each_end(tiny_model_dir: Path, tmp_path: Path) -> None:
    plain, trimmed = tmp_path / "plain", tmp_path / "trimmed"
    _synth(tiny_model_dir, plain)
    _synth(tiny_model_dir, trimmed, "--trim-silence")
    a, b = _records(plain), _records(trimmed)
    for rid in a:
        assert a[rid]["trimmed_lead_seconds"] == a[rid]["trimmed_trail_seconds"] == 0.0
        cut = b[rid]["trimmed_lead_seconds"] + b[rid]["trimmed_trail_seconds"]
        assert cut >= 0.0
        assert b[rid]["samples"] == round((b[rid]["audio_seconds"] - cut) * 24000)  # the file is what is left
        assert b[rid]["audio_seconds"] == a[rid]["audio_seconds"]  # the model's audio is the same


def test_export_reads_back_a_real_runs_rows(tiny_model_dir: Path, tmp_path: Path) -> None:
    import datasets
    import webdataset as wds

    from cosyclone.export.build import export

    out = tmp_path / "out"
    _synth(tiny_model_dir, out, "--sample-rate", "16000", "--audio-format", "flac")
    texts = {json.loads(x)["id"]: json.loads(x)["text"] for x in MANIFEST.read_text().splitlines()}
    parquet = export(out, fmt="parquet")
    ds = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in parquet.to_dir.glob("*.parquet")),
                               split="train")
    assert parquet.rows == len(ds) == 4 and {r["id"]: r["text"] for r in ds} == texts
    assert all(r["audio"]["sampling_rate"] == 16000 for r in ds)
    tars = export(out, fmt="webdataset")
    samples = list(wds.WebDataset(sorted(str(p) for p in tars.to_dir.glob("*.tar")), shardshuffle=False))
    assert tars.rows == 4 and sorted(json.loads(s["json"])["id"] for s in samples) == sorted(texts)
    assert all("flac" in s for s in samples)
