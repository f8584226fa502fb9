"""``cosyclone validate --show-text --json`` end to end: three modes, a refused row, a long cross_lingual row.

The model directory is a tiny one whose ``CosyVoice-BlankEN`` holds the reference Qwen2 vocabulary,
so the ids are compared with the official frontend's recorded ids (vectors/text).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.model.config import QWEN_DIR, SYSTEM_PREFIX
from tests.reference import reference_set, reference_tokenizer

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    return json.loads((reference_set("text") / "vectors.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-qwen2")
    assert runner.invoke(app, ["make-tiny-model", str(d), "--force"]).exit_code == 0
    qwen = d / QWEN_DIR
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        (qwen / name).unlink(missing_ok=True)
    ref = reference_tokenizer()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(ref / name, qwen / name)
    return d


def _case(vectors: dict[str, Any], name: str, variant: str) -> dict[str, Any]:
    return next(c for c in vectors["cases"] if c["name"] == name and c["variant"] == variant)


@pytest.fixture()
def manifest(tmp_path: Path, vectors: dict[str, Any]) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    zs = _case(vectors, "years_large", "zs_zh")
    long = _case(vectors, "en_5000", "xl_noprefix")
    rows = [
        {"id": "zs", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "希望你以后能够做的比我还好呦。",
         "text": zs["text"]},
        {"id": "xl", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": zs["text"]},
        {"id": "ins", "prompt_audio": "prompts/speaker1.wav", "mode": "instruct2",
         "instruct": "请用广东话表达。", "text": zs["text"]},
        {"id": "emoji", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "hi", "text": "😀😀😀"},
        {"id": "long", "prompt_audio": "prompts/speaker2.wav", "mode": "cross_lingual", "text": long["text"]},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_validate_json_is_one_object_per_row_with_the_official_ids(manifest: Path, model_dir: Path,
                                                                   vectors: dict[str, Any]) -> None:
    res = runner.invoke(
        app, ["validate", str(manifest), "--model-dir", str(model_dir), "--show-text", "--json"]
    )
    assert res.exit_code == 3, res.output  # one row refused
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["id"] for x in lines] == ["zs", "xl", "ins", "emoji", "long"]
    zs, xl, ins, emoji, long = lines
    official = _case(vectors, "years_large", "zs_zh")["official"]
    assert set(zs) == {"id", "mode", "prompt_ids", "segments"} and zs["mode"] == "zero_shot"
    assert zs["prompt_ids"] == official["prompt_ids"]  # the prefix added, as the README writes it
    assert [s["ids"] for s in zs["segments"]] == official["segment_ids"]
    assert [s["text"] for s in zs["segments"]] == official["segments"]
    xl_official = _case(vectors, "years_large", "xl_prefix")["official"]
    assert xl["prompt_ids"] == [] and [s["ids"] for s in xl["segments"]] == xl_official["segment_ids"]
    ins_official = _case(vectors, "years_large", "instruct2")["official"]
    assert ins["prompt_ids"] == ins_official["prompt_ids"]
    assert [s["ids"] for s in ins["segments"]] == ins_official["segment_ids"]
    assert (
        set(emoji) == {"id", "error"} and "line 4" in emoji["error"] and "nothing to speak" in emoji["error"]
    )
    zero_shot_segments = _case(vectors, "en_5000", "zs_en")["official"]["segments"]
    assert len(long["segments"]) == len(zero_shot_segments) > 1
    assert [s["text"] for s in long["segments"]] == [SYSTEM_PREFIX + s for s in zero_shot_segments]
    # the prefix's ids
    assert all(s["ids"][:7] == xl_official["segment_ids"][0][:7] for s in long["segments"])
    assert "4 valid rows, 1 rejected" in res.stderr


def test_validate_show_text_prints_segments_and_token_counts(manifest: Path, model_dir: Path) -> None:
    res = runner.invoke(app, ["validate", str(manifest), "--model-dir", str(model_dir), "--show-text"])
    assert res.exit_code == 3
    out = res.stdout
    assert "line 1, id 'zs', zero_shot: prompt 17 tokens" in out
    assert "  segment 1/1, 22 tokens: In nineteen ninety nine the population was one million" in out
    assert "line 4, id 'emoji', field 'text': text has nothing to speak" in out
    assert "line 5, id 'long', cross_lingual: prompt 0 tokens" in out and "  segment 17/17, " in out
    assert out.rstrip().endswith("4 valid rows, 1 rejected")


def test_validate_without_a_model_dir_uses_the_stand_in_tokenizer(manifest: Path) -> None:
    res = runner.invoke(app, ["validate", str(manifest), "--json"])
    assert res.exit_code == 3
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["id"] for x in lines] == ["zs", "xl", "ins", "emoji", "long"]
    assert "stand-in tokenizer" in res.stderr
    assert lines[0]["prompt_ids"][-1] != 151646 and 151646 in lines[0]["prompt_ids"]


def test_prompt_text_is_required_only_where_it_is_read(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows = [{"id": "a", "prompt_audio": "prompts/speaker1.wav", "mode": "cross_lingual", "text": "Hello."},
            {"id": "b", "prompt_audio": "prompts/speaker1.wav", "mode": "instruct2", "instruct": "Softly.",
             "text": "Hello."},
            {"id": "c", "prompt_audio": "prompts/speaker1.wav", "text": "Hello."}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["validate", str(path)])
    assert res.exit_code == 3
    assert "line 3, id 'c', field 'prompt_text': zero_shot needs the prompt's transcript" in res.stdout
    assert "2 valid rows, 1 rejected" in res.stdout


def test_text_frontend_option_is_checked(manifest: Path) -> None:
    res = runner.invoke(app, ["validate", str(manifest), "--text-frontend", "ttsfrd"])
    assert res.exit_code == 2 and "'wetext', 'none'" in res.stderr  # typer names the choices
