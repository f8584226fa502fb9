"""How an export is laid out: deterministic splits by id hash, ``-of-N`` shard names, ``--rows-per-shard``,
several run folders (a ``--shard i/N`` run's) as one set, the prompt recording embedded, and the
command's options taken from the option registry."""

from __future__ import annotations

import hashlib
import inspect
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.cli_options import ALL_GROUPS
from cosyclone.errors import CosycloneError, Exit
from cosyclone.export.build import export
from cosyclone.export.lock import read_marker
from cosyclone.export.options import ExportOptions
from cosyclone.export.rows import parse_splits, split_of
from cosyclone.export.shards import wds_key
from cosyclone.options import EXPORT, flag_of, option_fields
from tests.run_folders import Row, tone, write


def _ids(target: Path, split: str = "train") -> list[str]:
    import datasets

    return list(datasets.load_dataset(str(target), split=split)["id"])


def test_splits_keep_their_membership_on_a_rerun_and_as_the_folder_grows(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(out, [Row(f"row{i:03d}", i + 1) for i in range(60)])
    first = export(out, fmt="parquet", to_dir=tmp_path / "a", splits=["validation=0.2", "test=0.1"])
    val, test, train = _ids(tmp_path / "a", "validation"), _ids(tmp_path / "a", "test"), _ids(tmp_path / "a")
    assert sorted(val + test + train) == [f"row{i:03d}" for i in range(60)] and 4 <= len(val) <= 20
    assert first.splits == {"validation": len(val), "test": len(test), "train": len(train)}
    assert {p.name for p in (tmp_path / "a").glob("*.parquet")} == {
        "validation-00000-of-00001.parquet", "test-00000-of-00001.parquet", "train-00000-of-00001.parquet"}
    parts = parse_splits(["validation=0.2", "test=0.1"])
    assert all(split_of(i, parts) == "validation" for i in val) and all(
        split_of(i, parts) == "test" for i in test
    )
    write(out, [Row(f"new{i}", 100 + i) for i in range(5)])
    export(
        out, fmt="webdataset", to_dir=tmp_path / "b", splits=["validation=0.2", "test=0.1"], rows_per_shard=7
    )
    marker = read_marker(tmp_path / "b")
    assert marker is not None and marker["splits"]["validation"] >= len(val)
    import webdataset as wds

    urls = sorted(str(p) for p in (tmp_path / "b").glob("validation-*.tar"))
    again = [json.loads(s["json"])["id"] for s in wds.WebDataset(urls, shardshuffle=False)]
    assert [i for i in again if i.startswith("row")] == val  # the old rows kept their split
    names = sorted(p.name for p in (tmp_path / "b").glob("train-*.tar"))
    assert names[0] == f"train-00000-of-{len(names):05d}.tar" and all(
        s["rows"] <= 7 for s in marker["shards"]
    )


@pytest.mark.parametrize("spec", ["validation", "train=0.1", "validation=1.5", "Val=0.1", "a=0.6 b=0.5"])
def test_a_bad_split_names_the_option(spec: str) -> None:
    with pytest.raises(CosycloneError, match="--split"):
        parse_splits(spec.split())


def test_split_files_are_refused_inside_the_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(out, [Row("a", 1)])
    with pytest.raises(CosycloneError, match="--split .*audiofolder.*give --to outside the run folder"):
        export(out, splits=["validation=0.1"])


def test_two_shard_folders_export_as_one_set_and_duplicate_ids_are_named(tmp_path: Path) -> None:
    a, b = tmp_path / "shard0", tmp_path / "shard1"
    write(a, [Row(f"r{i}", i) for i in range(1, 4)])
    write(b, [Row(f"r{i}", i) for i in range(4, 7)] + [Row("lost", 7, status="failed")])
    res = CliRunner().invoke(
        app, ["export", str(a), str(b), "--to", str(tmp_path / "set"), "--format", "nemo"]
    )
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in (tmp_path / "set" / "manifest.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == [f"r{i}" for i in range(1, 7)]
    marker = read_marker(tmp_path / "set")
    assert marker is not None and [s["exported"] for s in marker["sources"]] == [3, 3]
    assert marker["skipped"] == [{"folder": str(b), "id": "lost", "reason": "failed", "detail": "exception"}]
    write(b, [Row("r2", 9)])
    with pytest.raises(
        CosycloneError, match=r"1 id in more than one run folder: r2 \(.*shard0 and .*shard1\)"
    ):
        export([a, b], to_dir=tmp_path / "set")
    with pytest.raises(CosycloneError, match="give --to"):
        export([a, b])


def test_the_prompt_recording_is_embedded_when_asked(tmp_path: Path) -> None:
    import datasets

    prompt = tmp_path / "voice.wav"
    sf.write(str(prompt), tone(3, 0.5), 16000)
    out = tmp_path / "out"
    digest = {"fingerprint_parts": {"prompt_audio": hashlib.sha256(prompt.read_bytes()).hexdigest()[:16]}}
    write(out, [Row("p1", 1, prompt_audio=str(prompt), extra=digest),
                Row("p2", 2, prompt_audio=str(tmp_path / "gone.wav"), extra=digest)])
    summary = export(out, fmt="parquet", to_dir=tmp_path / "pq", include_prompt_audio=True)
    assert summary.rows == 1 and summary.skipped["prompt_missing"] == 1
    ds = datasets.load_dataset(str(tmp_path / "pq"), split="train")
    assert ds[0]["prompt"]["sampling_rate"] == 16000
    assert np.allclose(ds[0]["prompt"]["array"], sf.read(str(prompt))[0], atol=1e-4)
    tars = export(out, fmt="webdataset", to_dir=tmp_path / "w", include_prompt_audio=True)
    import webdataset as wds

    sample = next(iter(wds.WebDataset([str(s.path) for s in tars.shards], shardshuffle=False)))
    assert sample["__key__"] == wds_key("p1") and sample["prompt.wav"] == prompt.read_bytes()
    assert sf.info(io.BytesIO(sample["prompt.wav"])).samplerate == 16000
    with pytest.raises(CosycloneError, match="--include-prompt-audio"):
        export(out, fmt="nemo", to_dir=tmp_path / "n", include_prompt_audio=True)


def test_the_export_options_come_from_the_option_registry() -> None:
    from cosyclone import cli

    command = next(c.callback for c in cli.app.registered_commands if c.name == "export")
    assert command is not None
    params = inspect.signature(command).parameters
    offered = [f for _, f in option_fields(*ALL_GROUPS) if EXPORT in f.metadata["commands"]]
    assert {f.name for f in offered} == {"format", "shard_size", "rows_per_shard", "to", "split",
                                         "include_prompt_audio", "only_passed", "allow_running"}
    for f in offered:
        assert params[f.name].default.param_decls == (flag_of(f),)
    with pytest.raises(CosycloneError, match="--format must be one of parquet, webdataset, nemo, lhotse"):
        ExportOptions(format="csv")  # type: ignore[arg-type]
    with pytest.raises(CosycloneError, match="--rows-per-shard must be at least 1"):
        ExportOptions(rows_per_shard=0)


def test_the_cli_takes_splits_and_rows_per_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(out, [Row(f"r{i}", i) for i in range(1, 11)])
    res = CliRunner().invoke(
        app,
        [
            "export",
            str(out),
            "--to",
            str(tmp_path / "t"),
            "--split",
            "validation=0.3",
            "--rows-per-shard",
            "2",
            "--format",
            "webdataset",
        ],
    )
    assert res.exit_code == Exit.OK, res.output
    assert "exported 10 of 10 rows (validation " in res.output
    nemo = CliRunner().invoke(
        app,
        ["export", str(out), "--to", str(tmp_path / "n"), "--split", "validation=0.3", "--format", "nemo"],
    )
    assert nemo.exit_code == Exit.OK, nemo.output
    files = {p.name: p for p in (tmp_path / "n").glob("manifest_*.jsonl")}
    assert sorted(files) == ["manifest_train.jsonl", "manifest_validation.jsonl"]
    val = [json.loads(x)["id"] for x in files["manifest_validation.jsonl"].read_text().splitlines()]
    parts = parse_splits(["validation=0.3"])
    assert val and all(split_of(i, parts) == "validation" for i in val)
    bad = CliRunner().invoke(app, ["export", str(out), "--split", "validation"])
    assert bad.exit_code == Exit.USAGE and "--split must be NAME=FRACTION" in bad.output
