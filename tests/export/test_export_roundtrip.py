"""No accepted input breaks an export: seeds up to 2^64-1, a Chinese text with a newline and an emoji,
an id with a dot and a space, and a ``meta`` speaker come back exactly from Parquet (pyarrow and
``datasets``), WebDataset (``webdataset``'s reader and ``datasets``' webdataset loader), NeMo and
Lhotse, with the columns builders filter on (stop reason, normalized text, sample rate, sampler
totals) derived from the one column table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cosyclone.export.build import export
from cosyclone.folder.columns import CORE, SAMPLER
from tests.run_folders import RATE, Row, write

TEXT = "你好，\n世界 🎉"
# six rows without meta first: datasets infers a WebDataset's types from its first five rows
ROWS = [*(Row(f"plain{i}", i, seed=i) for i in range(1, 7)),
    Row("low", 11, seed=7, text="plain words", meta={"speaker": "spk_a", "language": "en"}),
    Row("big", 12, seed=2**63, text=TEXT, meta={"speaker": "说话人", "language": "zh", "age": 31},
        stop_reasons=("eos", "max_len")),
    Row("a.b c", 13, seed=2**64 - 1, text="emoji 🎉 and\ttab", meta={"speaker": "spk_b", "tags": ["x", "y"]}),
    Row("nometa", 14, seed=0, text="no meta here"),
]
BY_ID = {r.id: r for r in ROWS}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "out"
    write(out, ROWS)
    return out


def _check(rows: list[dict[str, Any]], *, seed_as_text: bool = False) -> None:
    """Every row read back: its seed, text and speaker exactly, and the derived columns."""
    assert sorted(r["id"] for r in rows) == sorted(BY_ID)
    for r in rows:
        want = BY_ID[r["id"]]
        assert (int(r["seed"]) if seed_as_text else r["seed"]) == want.seed
        if seed_as_text:
            assert r["seed"] == str(want.seed)
        assert r["text"] == want.text
        assert r["speaker"] == (want.meta or {}).get("speaker")
        assert (json.loads(r["meta"]) if r["meta"] is not None else None) == want.meta
        assert r["sample_rate"] == RATE and r["stop_reason"] == ("max_len" if r["id"] == "big" else "eos")
        assert r["speech_tokens"] == 25 * len(want.stop_reasons)


def test_the_column_table_is_the_one_schema_of_every_format() -> None:
    names = [c.name for c in (*CORE, *SAMPLER)]
    assert len(names) == len(set(names))
    assert {"id", "seed", "text", "normalized_text", "stop_reason", "sample_rate", "duration", "meta"} <= set(
        names
    )
    assert {c.type for c in CORE if c.name == "seed"} == {"uint64"}
    assert "sampler_ras_fallbacks" in names and "sampler_steps" in names


def test_parquet_gives_back_exact_seeds_texts_and_speakers(folder: Path, tmp_path: Path) -> None:
    import datasets
    import pyarrow.parquet as pq

    summary = export(folder, fmt="parquet", to_dir=tmp_path / "pq")
    table = pq.read_table([str(s.path) for s in summary.shards][0])
    assert str(table.schema.field("seed").type) == "uint64"
    _check(table.to_pylist())
    ds = datasets.load_dataset("parquet", data_files=[str(s.path) for s in summary.shards], split="train")
    assert datasets.load_dataset(str(tmp_path / "pq"), split="train")["seed"] == ds["seed"]
    assert ds.features["seed"].dtype == "uint64" and ds.features["speaker"].dtype == "string"
    _check([{k: v for k, v in row.items() if k != "audio"} for row in ds])
    assert "language" in ds.column_names and "age" not in ds.column_names  # age is a number: in meta only
    assert "tags" not in ds.column_names


def test_webdataset_gives_them_back_to_webdataset_and_to_datasets(folder: Path, tmp_path: Path) -> None:
    import datasets
    import webdataset as wds

    summary = export(folder, fmt="webdataset", to_dir=tmp_path / "wds")
    urls = [str(s.path) for s in summary.shards]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    _check([json.loads(s["json"]) for s in samples], seed_as_text=True)
    ds = datasets.load_dataset(str(tmp_path / "wds"), split="train")  # typed by the export's README.md
    _check([dict(row["json"]) for row in ds], seed_as_text=True)
    assert ds.features["wav"].sampling_rate == RATE
    assert all(row["wav"] is not None for row in ds.cast_column("wav", datasets.Audio(decode=False)))


def test_nemo_manifest_lines_point_at_the_files_and_carry_every_column(folder: Path, tmp_path: Path) -> None:
    import soundfile as sf

    summary = export(folder, fmt="nemo", to_dir=tmp_path / "nemo")
    assert [s.path.name for s in summary.shards] == ["manifest.jsonl"]
    lines = [json.loads(x) for x in summary.shards[0].path.read_text(encoding="utf-8").splitlines()]
    _check(lines, seed_as_text=True)
    for line in lines:
        info = sf.info(line["audio_filepath"])
        assert Path(line["audio_filepath"]).is_absolute()
        assert line["duration"] == pytest.approx(info.frames / info.samplerate)


def test_lhotse_reads_its_manifests_back(folder: Path, tmp_path: Path) -> None:
    lhotse = pytest.importorskip("lhotse")

    summary = export(folder, fmt="lhotse", to_dir=tmp_path / "lhotse")
    assert sorted(s.path.name for s in summary.shards) == ["recordings.jsonl.gz", "supervisions.jsonl.gz"]
    recordings = lhotse.load_manifest(tmp_path / "lhotse" / "recordings.jsonl.gz")
    supervisions = lhotse.load_manifest(tmp_path / "lhotse" / "supervisions.jsonl.gz")
    rows = []
    for sup in supervisions:
        rec = recordings[sup.recording_id]
        assert rec.sampling_rate == RATE and rec.load_audio().shape[-1] == rec.num_samples
        assert sup.duration == pytest.approx(rec.duration)
        rows.append({"id": sup.id, "text": sup.text, "speaker": sup.speaker, **(sup.custom or {})})
        assert sup.language == (BY_ID[sup.id].meta or {}).get("language")
    _check(rows, seed_as_text=True)


def test_normalized_text_and_stop_reason_come_from_the_record_when_it_has_them(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    write(out, [Row("n", 1, text="3 cats", extra={"normalized_text": "three cats", "stop_reason": "max_len"}),
                Row("m", 2, text="4 dogs", stop_reasons=("eos", "eos"))])
    summary = export(out, fmt="parquet")
    rows = {r["id"]: r for r in pq.read_table(str(summary.shards[0].path)).to_pylist()}
    assert (rows["n"]["normalized_text"], rows["n"]["stop_reason"]) == ("three cats", "max_len")
    assert rows["m"]["stop_reason"] == "eos" and rows["m"]["stop_reasons"] == ["eos", "eos"]


def test_a_record_of_odd_types_exports_with_nulls_not_an_error(tmp_path: Path) -> None:
    """A record is data: a value of another type (an older writer, a hand edit) reads as the column's null."""
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    odd: Any = ["a", "list"]  # a record as found on disk, not as typed
    write(out, [Row("odd", 1, meta=odd, extra={"speed": "fast", "seed": -1, "normalized_text": 5}),
                Row("fine", 2, meta={"speaker": "s"})])
    summary = export(out, fmt="parquet")
    rows = {r["id"]: r for r in pq.read_table(str(summary.shards[0].path)).to_pylist()}
    assert (rows["odd"]["speed"], rows["odd"]["seed"], rows["odd"]["speaker"]) == (None, None, None)
    # no segments either
    assert rows["odd"]["meta"] == '["a", "list"]' and rows["odd"]["normalized_text"] is None
    assert (rows["fine"]["speed"], rows["fine"]["speaker"]) == (1.0, "s")


def test_docs_output_names_every_column_of_the_table() -> None:
    from tests.run_folders import ROOT

    doc = (ROOT / "docs" / "output.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Shards for training"):]
    missing = [c.name for c in CORE if f"`{c.name}`" not in section]
    missing += [c.name for c in SAMPLER if f"`{c.name.removeprefix('sampler_')}`" not in section]
    assert not missing, f"docs/output.md's export columns lack {missing}"
