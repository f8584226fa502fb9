"""``cosyclone export``: a run folder's ok rows, and only those whose file matches the record, as
Parquet shards ``datasets`` loads with an Audio column and as WebDataset tars ``webdataset`` reads;
eval's verdicts as columns; shards rewritten whole on a rerun; the run folder itself never touched.

The folders are made with the writer itself (no model): records and WAVs as a run leaves them."""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.engine import RowResult
from cosyclone.engine.outcome import RowStatus
from cosyclone.errors import CosycloneError
from cosyclone.export.build import export
from cosyclone.export.options import parse_size
from cosyclone.export.shards import wds_key
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.folder.layout import wav_path
from cosyclone.folder.row_record import RowStamp
from cosyclone.folder.settle import settle
from cosyclone.folder.writer import BackgroundWriter, WriterOptions
from tests.every_record import read_records

RATE = 24000


def audio(i: int, seconds: float = 0.25) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.4 * np.sin(2 * np.pi * (200 + 20 * i) * t)).astype(np.float32)


def stamp(row_id: str) -> RowStamp:
    return RowStamp(fingerprint=None, fingerprint_parts=None, run_id="r", text=f"text of {row_id}",
                    prompt_text="reference words", prompt_audio="prompts/speaker1.wav", mode="zero_shot",
                    instruct="", speed=1.0, manifest="m.jsonl", shard=None)


def result(row_id: str, line: int, status: RowStatus = "ok") -> RowResult:
    wav = audio(line) if status == "ok" else None
    return RowResult(id=row_id, line=line, seed=100 + line, status=status, audio=wav,
                     audio_seconds=0.0 if wav is None else wav.size / RATE)


def diag(row_id: str, line: int, *, status: RowStatus, finished_at: float = 1000.0) -> dict[str, Any]:
    """A record line as a journal holds it (written by hand: a later attempt with a chosen time)."""
    from dataclasses import replace

    from cosyclone.folder.row_record import NO_FILE, make_record

    return replace(
        make_record(result(row_id, line, status), stamp(row_id), NO_FILE), finished_at=finished_at
    ).to_json()


def write_rows(out: Path, rows: list[tuple[str, int, RowStatus]], *, settled: bool = True,
               output: AudioOutput = AudioOutput()) -> None:
    """(id, line, status) rows through the real writer: the file first, then the record; settled like a run's
    end."""
    writer = BackgroundWriter(WriterOptions(out_dir=out, output=output), runfolder.journal_path(out, "all"))
    try:
        for row_id, line, status in rows:
            writer.write_now(result(row_id, line, status), stamp(row_id))
    finally:
        writer.close()
    if settled:
        settle(out, "all")


def write_processed(out: Path, row_id: str, line: int, spec: AudioOutput) -> None:
    """A row written by the writer at a non-default output (its file named in the record)."""
    write_rows(out, [(row_id, line, "ok")], output=spec)


def folder_digest(out: Path) -> dict[str, str]:
    """Every file of the run folder (the export directory and the index, derived from the records, aside)
    with its content hash."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "export" not in p.relative_to(out).parts and not p.name.startswith("index.sqlite")
    }


def load_parquet(directory: Path) -> Any:
    import datasets

    files = sorted(str(p) for p in directory.glob("*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train")


def read_tars(directory: Path) -> list[dict[str, Any]]:
    import webdataset as wds

    urls = sorted(str(p) for p in directory.glob("*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False))


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """8 rows: 5 whole, 1 failed, 1 ok whose WAV was deleted, 1 ok whose WAV is torn."""
    out = tmp_path / "out"
    write_rows(out, [("r0", 1, "ok"), ("r1", 2, "ok"), ("bad", 3, "failed"), ("gone", 4, "ok"),
                     ("torn", 5, "ok"), ("r5", 6, "ok"), ("a.b c", 7, "ok"), ("ünï", 8, "ok")])
    wav_path(out, "gone").unlink()
    torn = wav_path(out, "torn")
    torn.write_bytes(torn.read_bytes()[:2000])
    return out


EXPORTED = ["r0", "r1", "r5", "a.b c", "ünï"]  # the ok rows with whole files, by manifest line


def test_parquet_loads_with_datasets_as_the_folders_ok_rows(run_folder: Path) -> None:
    import datasets

    lines: list[str] = []
    summary = export(run_folder, fmt="parquet", log=lines.append)
    ds = load_parquet(summary.to_dir)
    assert summary.to_dir == run_folder / "export" / "parquet" and len(lines) == 1 and "5 rows" in lines[0]
    assert ds["id"] == EXPORTED and summary.rows == 5 and summary.records == 8
    assert summary.skipped == {"failed": 1, "audio_missing": 1, "audio_mismatch": 1, "not_passed": 0,
                               "prompt_missing": 0, "prompt_mismatch": 0, "corrupt_record": 0}
    assert isinstance(ds.features["audio"], datasets.Audio) and ds.features["audio"].sampling_rate == RATE
    records = read_records(run_folder)
    for row in ds:
        rec = records[row["id"]]
        wav, rate = sf.read(str(wav_path(run_folder, row['id'])), dtype="float64")
        assert row["audio"]["sampling_rate"] == rate == RATE
        assert np.array_equal(row["audio"]["array"], wav)
        assert (row["text"], row["prompt_text"], row["mode"], row["seed"]) == (
            rec.text, rec.prompt_text, rec.mode, rec.seed)
        assert row["duration"] == pytest.approx(rec.audio_seconds)


def test_webdataset_reads_back_the_same_rows_with_their_real_ids(run_folder: Path) -> None:
    summary = export(run_folder, fmt="webdataset")
    samples = read_tars(summary.to_dir)
    metas = [json.loads(s["json"]) for s in samples]
    assert [m["id"] for m in metas] == EXPORTED
    assert [s["__key__"] for s in samples] == [wds_key(i) for i in EXPORTED]
    assert wds_key("a.b c") == "a%2Eb%20c" and "." not in wds_key("ünï")
    for s, m in zip(samples, metas, strict=True):
        assert s["wav"] == wav_path(run_folder, m['id']).read_bytes()
        assert m["sample_rate"] == RATE and m["text"] == f"text of {m['id']}"


def test_a_16k_flac_folder_exports_at_its_rate_in_both_formats(tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = AudioOutput(sample_rate=16000, format="flac", encoding="pcm24")
    for i in range(3):
        write_processed(out, f"f{i}", i + 1, spec)
    ds = load_parquet(export(out, fmt="parquet").to_dir)
    assert ds.features["audio"].sampling_rate == 16000 and len(ds) == 3
    for row in ds:
        flac, rate = sf.read(str(wav_path(out, row['id'], ".flac")), dtype="float64")
        assert rate == 16000 and row["audio"]["sampling_rate"] == 16000
        assert np.array_equal(row["audio"]["array"], flac)
    samples = read_tars(export(out, fmt="webdataset").to_dir)
    assert [sorted(k for k in s if not k.startswith("__")) for s in samples] == [["flac", "json"]] * 3
    assert sf.info(io.BytesIO(samples[0]["flac"])).samplerate == 16000


def test_the_latest_record_wins_and_a_run_in_progress_exports_what_it_finished(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_rows(out, [("a", 1, "ok"), ("b", 2, "ok"), ("c", 3, "ok")])
    journal = runfolder.Journal(runfolder.journal_path(out, "shard-0-of-2"))
    # redone after, failed: not exported
    journal.append(diag("a", 1, status="failed", finished_at=time.time() + 60))
    journal.append(diag("b", 2, status="failed", finished_at=1.0))  # older than the ok record: ignored
    journal.close()
    with open(runfolder.journal_path(out, "shard-0-of-2"), "a") as fh:
        fh.write('{"id": "c", "status": "fa')  # a torn last line (a kill mid-write)
    assert export(out, fmt="parquet").rows == 2
    assert load_parquet(out / "export" / "parquet")["id"] == ["b", "c"]


def test_export_never_changes_the_run_folder(run_folder: Path) -> None:
    # an unsettled journal stays as it is
    journal = runfolder.Journal(runfolder.journal_path(run_folder, "all"))
    journal.append(diag("late", 9, status="failed"))
    journal.close()
    before = folder_digest(run_folder)
    export(run_folder, fmt="parquet")
    export(run_folder, fmt="webdataset", shard_size_bytes=30_000)
    assert folder_digest(run_folder) == before


def test_shards_keep_to_the_size_and_are_the_same_bytes_every_time(run_folder: Path, tmp_path: Path) -> None:
    wav_bytes = wav_path(run_folder, "r0").stat().st_size  # about 12 kB a row
    limit = 2 * wav_bytes + 9000  # two rows fit, with a tar's headers and its padding to 10240-byte records
    for fmt in ("webdataset", "parquet"):
        first = export(run_folder, fmt=fmt, shard_size_bytes=limit, to_dir=tmp_path / fmt)
        digests = [hashlib.sha256(s.path.read_bytes()).hexdigest() for s in first.shards]
        assert [s.rows for s in first.shards] == [2, 2, 1]
        ext = first.shards[0].path.suffix
        assert [s.path.name for s in first.shards] == [f"data-0000{i}-of-00003{ext}" for i in (0, 1, 2)]
        if fmt == "webdataset":
            assert all(s.bytes <= limit for s in first.shards)  # exact for tars, about for Parquet
        again = export(run_folder, fmt=fmt, shard_size_bytes=limit, to_dir=tmp_path / fmt)
        assert [hashlib.sha256(s.path.read_bytes()).hexdigest() for s in again.shards] == digests
        assert not list((tmp_path / fmt).glob(".*.tmp"))


def test_a_rerun_on_a_grown_folder_rewrites_every_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_rows(out, [(f"r{i}", i, "ok") for i in range(1, 7)])
    target = out / "export" / "webdataset"
    assert len(export(out, fmt="webdataset", shard_size_bytes=1).shards) == 6  # a row a shard
    (target / "notes.txt").write_text("mine")
    write_rows(out, [(f"r{i}", i, "ok") for i in range(7, 10)])
    grown = export(out, fmt="webdataset", shard_size_bytes=parse_size("100MB"))
    assert [s.path.name for s in grown.shards] == ["data-00000-of-00001.tar"]
    # the six old shards gone, the user's own file carried into the new export
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "data-00000-of-00001.tar", "export.json",
                                                        "notes.txt"]
    assert [json.loads(s["json"])["id"] for s in read_tars(target)] == [f"r{i}" for i in range(1, 10)]


def eval_line(row_id: str, out: Path, **fields: Any) -> dict[str, Any]:
    sha = hashlib.sha256(wav_path(out, row_id).read_bytes()).hexdigest()
    return {"id": row_id, "status": "ok", "wav_sha256": sha, "metric": "wer", "error_rate": 0.0, "wer": 0.0,
            "cer": 0.0, "transcript": f"text of {row_id}", "speaker_similarity": {"resemblyzer": 0.9},
            "lead_silence_s": 0.0, "trail_silence_s": 0.0, "clipped_fraction": 0.0, "fails": {}, **fields}


def test_eval_verdicts_become_columns_and_only_passed_keeps_the_rows_eval_passed(run_folder: Path) -> None:
    lines = [eval_line("r0", run_folder),
             eval_line("r1", run_folder, error_rate=0.4, wer=0.4, fails={"error_rate": "wer 0.400 > 0.1"}),
             eval_line("r5", run_folder, wav_sha256="0" * 64),  # scored an earlier file of the row: stale
             eval_line("a.b c", run_folder, speaker_similarity={"campplus": 0.7})]  # "ünï": never evaluated
    (run_folder / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ds = load_parquet(export(run_folder, fmt="parquet").to_dir)
    by_id = {row["id"]: row for row in ds}
    assert [by_id[i]["eval_status"] for i in EXPORTED] == ["ok", "ok", "stale", "ok", "missing"]
    assert [by_id[i]["eval_passed"] for i in EXPORTED] == [True, False, False, True, False]
    assert by_id["r1"]["eval_fails"] == ["error_rate"] and by_id["r1"]["eval_wer"] == 0.4
    assert by_id["r5"]["eval_wer"] is None and by_id["r0"]["eval_transcript"] == "text of r0"
    assert (by_id["r0"]["eval_similarity_resemblyzer"], by_id["a.b c"]["eval_similarity_campplus"]) == (
        0.9,
        0.7,
    )
    passed = export(run_folder, fmt="webdataset", only_passed=True)
    assert [json.loads(s["json"])["id"] for s in read_tars(passed.to_dir)] == ["r0", "a.b c"]
    assert passed.skipped["not_passed"] == 3


def test_unusable_requests_are_refused_naming_the_option(run_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(CosycloneError, match="--only-passed .* no scores.jsonl"):
        export(run_folder, only_passed=True)
    with pytest.raises(CosycloneError, match="--format"):
        export(run_folder, fmt="tfrecord")  # type: ignore[arg-type]
    with pytest.raises(CosycloneError, match="--to"):
        export(run_folder, to_dir=run_folder / "wavs")
    with pytest.raises(CosycloneError, match="not a run folder"):
        export(tmp_path)
    write_processed(run_folder, "r16k", 20, AudioOutput(sample_rate=16000))
    with pytest.raises(CosycloneError, match="16000 Hz: 1 row, 24000 Hz: 7 rows"):
        export(run_folder)


@pytest.mark.parametrize(("text", "size"), [("500MB", 500 * 10**6), ("2GB", 2 * 10**9), ("100KB", 100_000),
                                            ("1.5GiB", 3 * 2**29), ("123", 123), ("64 mb", 64 * 10**6)])
def test_shard_sizes_parse_with_decimal_and_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "5XB", "0", "5 B B"])
def test_a_bad_shard_size_names_the_option(text: str) -> None:
    with pytest.raises(CosycloneError, match="--shard-size"):
        parse_size(text)


def test_the_cli_prints_a_line_per_shard_and_exits_2_on_bad_input(run_folder: Path) -> None:
    res = CliRunner().invoke(
        app, ["export", str(run_folder), "--format", "webdataset", "--shard-size", "30KB"]
    )
    assert res.exit_code == 0, res.output
    shard_lines = [line for line in res.output.splitlines() if line.endswith("bytes") and ".tar:" in line]
    assert len(shard_lines) >= 2 and "exported 5 of 8 rows at 24000 Hz" in res.output
    bad = CliRunner().invoke(app, ["export", str(run_folder), "--shard-size", "lots"])
    assert bad.exit_code == 2 and "--shard-size" in bad.output


def test_the_folder_still_loads_as_an_audiofolder_beside_its_exports(run_folder: Path) -> None:
    import datasets

    export(run_folder, fmt="parquet")
    export(run_folder, fmt="webdataset")
    ds = datasets.load_dataset("audiofolder", data_dir=str(run_folder), split="train")
    listed = [
        json.loads(x)["id"]
        for m in sorted(run_folder.rglob("metadata.jsonl"))
        for x in m.read_text().splitlines()
    ]
    # the metadata files' rows, no shard taken for a split
    assert sorted(ds["id"]) == sorted(listed) and len(listed) == 7


def test_tar_members_have_fixed_headers_and_long_ids_survive(tmp_path: Path) -> None:
    import tarfile

    out = tmp_path / "out"
    # 200 bytes: the longest id a manifest takes; its key is 600 characters (a PAX header)
    long_id = "é" * 100
    write_rows(out, [(long_id, 1, "ok"), ("short", 2, "ok")])
    summary = export(out, fmt="webdataset")
    with tarfile.open(summary.shards[0].path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [f"{wds_key(long_id)}.wav", f"{wds_key(long_id)}.json", "short.wav",
                                        "short.json"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert summary.shards[0].bytes % tarfile.RECORDSIZE == 0
    assert [json.loads(s["json"])["id"] for s in read_tars(summary.to_dir)] == [long_id, "short"]
