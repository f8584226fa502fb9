"""Manifest validation that file systems force: look-alike ids, a directory as prompt_audio,
and the Python API's rows validated by the same code with the same line numbers."""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path

import pytest

from cosyclone.manifest import id_key, read_manifest, rows_from_dicts

ROOT = Path(__file__).resolve().parents[2]


def _manifest(tmp_path: Path, ids: list[str], audio: str = "prompts/speaker1.wav") -> Path:
    if not (tmp_path / "prompts").exists():
        shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt_audio": audio, "mode": "cross_lingual",
                                        "text": "Hello."}, ensure_ascii=False) + "\n" for i in ids),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("first, second", [
    ("Take", "take"),  # case: the same file on macOS and Windows
    (unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")),  # NFC vs NFD
    ("ﬁle", "file"),  # NFKC: the ligature
    ("Straße", "STRASSE"),  # full case folding
])
def test_ids_equal_after_normalization_or_case_folding_are_duplicates(tmp_path: Path, first: str,
                                                                      second: str) -> None:
    assert first != second and id_key(first) == id_key(second)
    m = read_manifest(_manifest(tmp_path, [first, "other", second]))
    assert [r.id for r in m.rows] == [first, "other"]
    (err,) = m.errors
    assert err.line == 3 and err.field == "id" and "first used on line 1" in str(err)
    assert "normalization" in str(err) and "macOS and Windows" in str(err)


def test_an_exact_duplicate_keeps_the_short_message(tmp_path: Path) -> None:
    (err,) = read_manifest(_manifest(tmp_path, ["a", "a"])).errors
    assert str(err) == "line 2, id 'a', field 'id': duplicate id (first used on line 1)"


def test_distinct_ids_stay_distinct(tmp_path: Path) -> None:
    m = read_manifest(_manifest(tmp_path, ["a1", "a2", "é", "e"]))
    assert not m.errors and len(m.rows) == 4


def test_a_directory_as_prompt_audio_says_so(tmp_path: Path) -> None:
    (err,) = read_manifest(_manifest(tmp_path, ["a"], audio="prompts")).errors
    assert err.field == "prompt_audio" and "is a directory, not an audio file" in str(err)
    assert "not found" not in str(err)


def test_rows_from_dicts_validates_like_a_manifest(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows = [{"id": "a", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": "Hello."},
            {"id": "A", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": "Hi."},
            {"id": "b", "prompt_audio": "prompts/speaker1.wav", "text": "Hello."},
            "not an object"]
    m = rows_from_dicts(rows, base=tmp_path)
    assert [r.id for r in m.rows] == ["a"] and m.rows[0].prompt_audio == (
        tmp_path / "prompts" / "speaker1.wav"
    )
    assert [(e.line, e.field) for e in m.errors] == [(2, "id"), (3, "prompt_text"), (4, None)]
