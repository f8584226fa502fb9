"""Manifest validation, per-row errors and shards (no model work)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cosyclone.base.shard import Shard
from cosyclone.errors import CosycloneError
from cosyclone.manifest import check_id, read_manifest


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    sf.write(str(tmp_path / "p.wav"), np.zeros(1600, np.float32), 16000)
    (tmp_path / "bad.wav").write_bytes(b"not audio at all")
    return tmp_path


def row(i: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"id": i, "prompt_audio": "p.wav", "prompt_text": "hi there", "text": "hello"}
    base.update(kw)
    return base


def write(folder: Path, lines: list) -> Path:
    path = folder / "m.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_good_rows_and_defaults(folder: Path) -> None:
    m = read_manifest(write(folder, [row("a"), row("b", seed=3, speed=1.5, mode="cross_lingual")]))
    assert m.ok and [r.id for r in m.rows] == ["a", "b"]
    assert m.rows[0].mode == "zero_shot" and m.rows[0].seed is None
    assert m.rows[1].prompt_audio == (folder / "p.wav").resolve()
    assert m.rows[0].prompt_seconds == pytest.approx(0.1)  # from the header, for --token-budget
    assert read_manifest(folder / "m.jsonl", check_audio=False).rows[0].prompt_seconds == 0.0


def test_example_manifest_prompts_are_speech_length_recordings() -> None:
    root = Path(__file__).resolve().parents[2] / "manifests"
    m = read_manifest(root / "example.jsonl")
    assert m.ok and len(m.rows) == 4
    for r in m.rows:
        info = sf.info(str(r.prompt_audio))
        assert info.channels == 1 and info.subtype == "PCM_16" and info.samplerate >= 16000
        assert 2.0 <= r.prompt_seconds <= 5.0
    assert (root / "make_prompts.sh").is_file()


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (row("x", extra=1), "extra"),
        (row("x", text="  "), "text"),
        (row("x", prompt_audio="nope.wav"), "prompt_audio"),
        (row("x", prompt_audio="bad.wav"), "prompt_audio"),
        (row("../x"), "id"),
        (row("a/b"), "id"),
        (row("a\tb"), "id"),
        (row(""), "id"),
        (row("x", mode="sing"), "mode"),
        (row("x", mode="instruct2"), "instruct"),
        (row("x", seed=-1), "seed"),
        (row("x", speed="fast"), "speed"),
    ],
)
def test_bad_rows_are_isolated_with_line_and_field(folder: Path, bad: dict, field: str) -> None:
    m = read_manifest(write(folder, [row("a"), bad, row("c")]))
    assert [r.id for r in m.rows] == ["a", "c"]
    (err,) = m.errors
    assert err.line == 2 and err.field == field and "line 2" in str(err)


def test_json_syntax_and_duplicates(folder: Path) -> None:
    m = read_manifest(write(folder, [row("a"), "{not json", row("a"), "", "[1]", row("b")]))
    assert [r.id for r in m.rows] == ["a", "b"]
    assert [(e.line, e.field) for e in m.errors] == [(2, None), (3, "id"), (5, None)]


def test_unusable_file(tmp_path: Path) -> None:
    with pytest.raises(CosycloneError):
        read_manifest(tmp_path / "missing.jsonl")


def test_check_id() -> None:
    assert check_id("speaker_01-take.2") is None
    for bad in ("..", "a\\b", "a\x00", " a", "", 5, "-rf"):
        assert check_id(bad) is not None


@pytest.mark.parametrize("n_shards", [1, 2, 3, 7])
def test_shards_disjoint_and_covering(folder: Path, n_shards: int) -> None:
    m = read_manifest(write(folder, [row(f"r{i}") for i in range(10)] + ["{bad"]))
    seen: list[str] = []
    errors = 0
    for i in range(n_shards):
        part = m.shard(Shard(i, n_shards))
        seen += [r.id for r in part.rows]
        errors += len(part.errors)
    assert seen == [f"r{i}" for i in range(10)] and errors == 1


def test_shard_parse() -> None:
    assert Shard.parse("1/4") == Shard(1, 4)
    for bad in ("4/4", "x", "1/0", "-1/2"):
        with pytest.raises(CosycloneError):
            Shard.parse(bad)


def test_prompt_rate_and_length_checked_from_the_header(folder: Path) -> None:
    """The frontend's limits (>= 16 kHz, <= 30 s) reject a row at validation, naming line and field."""
    sf.write(str(folder / "phone.wav"), np.zeros(800, np.float32), 8000)
    sf.write(str(folder / "long.wav"), np.zeros(31 * 16000, np.float32), 16000)
    m = read_manifest(
        write(folder, [row("a"), row("b", prompt_audio="phone.wav"), row("c", prompt_audio="long.wav")])
    )
    assert [r.id for r in m.rows] == ["a"]
    errors = [str(e) for e in m.errors]
    assert "line 2" in errors[0] and "prompt_audio" in errors[0] and "8000 Hz" in errors[0]
    assert "line 3" in errors[1] and "prompt_audio" in errors[1] and "31.00 s" in errors[1]
