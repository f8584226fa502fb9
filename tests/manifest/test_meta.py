"""A row's ``meta`` object (the user's own fields) is accepted as any JSON object and kept exactly;
any other unknown field is refused, and ``validate`` names every unknown field of a line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.manifest import read_manifest, rows_from_dicts
from cosyclone.manifest.lines import MAX_DEPTH


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    sf.write(str(tmp_path / "p.wav"), np.zeros(16000, np.float32), 16000)
    return tmp_path


def _row(i: str, **kw: object) -> dict:
    return {"id": i, "prompt_audio": "p.wav", "prompt_text": "hi there", "text": "hello", **kw}


def _write(folder: Path, rows: list[dict]) -> Path:
    path = folder / "m.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_meta_is_kept_exactly_as_written(folder: Path) -> None:
    meta = {"speaker": "安娜 🎙", "language": "zh", "age": 31, "tags": ["a", {"b": [1.5, None, True]}],
            "big": 2**64 - 1}
    m = read_manifest(_write(folder, [_row("a", meta=meta), _row("b")]), text_frontend="none")
    assert m.ok, m.errors
    assert m.rows[0].meta == meta and m.rows[1].meta is None
    assert list(m.rows[0].meta) == list(meta)  # the key order as written


@pytest.mark.parametrize("bad", ["anna", ["speaker", "anna"], 3, None])
def test_meta_that_is_not_an_object_is_that_rows_error(folder: Path, bad: object) -> None:
    m = read_manifest(_write(folder, [_row("a", meta=bad), _row("b")]), text_frontend="none")
    (err,) = m.errors
    assert err.line == 1 and err.field == "meta" and "JSON object" in str(err)
    assert [r.id for r in m.rows] == ["b"]


def test_the_api_refuses_meta_json_cannot_write_and_copies_what_it_keeps() -> None:
    mine = {"speaker": "anna"}
    m = rows_from_dicts([_row("a", meta=mine), _row("b", meta={"x": float("nan")}), _row("c", meta={1: "x"}),
                         _row("d", meta={"x": "\ud800"}), _row("e", meta={"x": object()})],
                        check_audio=False, text_frontend="none")
    assert [r.id for r in m.rows] == ["a"] and [e.line for e in m.errors] == [2, 3, 4, 5]
    assert all(e.field == "meta" for e in m.errors)
    mine["speaker"] = "changed later"
    assert m.rows[0].meta == {"speaker": "anna"}


def test_meta_nests_as_deep_as_a_line_allows(folder: Path) -> None:
    deep: object = "leaf"
    for _ in range(MAX_DEPTH - 1):  # the row object is one more level
        deep = {"k": deep}
    too_deep = {"k": deep}
    m = read_manifest(_write(folder, [_row("a", meta=deep), _row("b", meta=too_deep)]), text_frontend="none")
    assert [r.id for r in m.rows] == ["a"] and m.errors[0].line == 2 and "levels deep" in str(m.errors[0])


def test_unknown_fields_stay_refused_and_every_one_is_named(folder: Path) -> None:
    path = _write(folder, [_row("a", speaker="anna", language="en"), _row("b", promt_text="x"), _row("c")])
    m = read_manifest(path, text_frontend="none")
    assert [r.id for r in m.rows] == ["c"]
    first, second = m.errors
    assert "unknown fields 'language', 'speaker'" in str(first) and '"meta"' in str(first)
    assert second.field == "promt_text" and "unknown field " in str(second)
    res = CliRunner().invoke(app, ["validate", str(path), "--text-frontend", "none"])
    assert res.exit_code == 3
    line1 = next(x for x in res.output.splitlines() if "line 1" in x)
    assert "'language'" in line1 and "'speaker'" in line1
