"""Tokenizer special ids, prompt formats per mode, normalization and splitting."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyclone.config import SYSTEM_PREFIX
from cosyclone.errors import CosycloneError
from cosyclone.frontend.text import SPECIAL_TOKENS, TextFrontend, number_to_words, split_paragraph
from cosyclone.frontend.tiny_assets import write_tiny_tokenizer


@pytest.fixture(scope="module")
def fe(tmp_path_factory: pytest.TempPathFactory) -> TextFrontend:
    return TextFrontend(write_tiny_tokenizer(tmp_path_factory.mktemp("qwen")))


def test_special_ids(fe: TextFrontend) -> None:
    ids = fe.tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|endofprompt|>", "[breath]",
                                              "<|endofsystem|>", "[AA]", "[a]", "[ǜ]"])
    assert ids == [151643, 151646, 151647, 151663, 151664, 151748, 151923]
    assert len(SPECIAL_TOKENS) == 280 and max(ids) < 151936
    assert fe.encode("x<|endofprompt|>[breath]")[-2:] == [151646, 151647]


def test_modes(fe: TextFrontend) -> None:
    p, segs = fe.build_text("zero_shot", "hi there", "Hello world.")
    assert p == fe.encode(SYSTEM_PREFIX + "hi there") and 151646 in p
    assert segs == [fe.encode("Hello world.")]
    p2, _ = fe.build_text("zero_shot", SYSTEM_PREFIX + "hi there", "Hello world.")
    assert p2 == p
    p, segs = fe.build_text("cross_lingual", None, "Hello world")
    assert p == [] and len(segs) == 1 and segs[0] == fe.encode(SYSTEM_PREFIX + "Hello world")
    p, segs = fe.build_text("instruct2", None, "Hello world.", "Speak softly.")
    assert p == fe.encode("You are a helpful assistant. Speak softly.<|endofprompt|>")


def test_errors(fe: TextFrontend) -> None:
    with pytest.raises(CosycloneError, match="row 'r'.*prompt transcript"):
        fe.build_text("zero_shot", None, "x", row_id="r")
    with pytest.raises(CosycloneError, match="instruction"):
        fe.build_text("instruct2", None, "x")
    with pytest.raises(CosycloneError, match="unknown mode"):
        fe.build_text("sft", None, "x")
    with pytest.raises(CosycloneError, match="empty"):
        fe.build_text("zero_shot", "a", "  ")


def test_bad_tokenizer_rejected(tmp_path: Path) -> None:
    import json
    d = write_tiny_tokenizer(tmp_path / "q")
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["added_tokens"] = tj["added_tokens"][:1]
    for k in ("<|im_start|>", "<|im_end|>"):
        tj["model"]["vocab"].pop(k)
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(CosycloneError, match="151646"):
        TextFrontend(d)


def test_numbers_and_normalize(fe: TextFrontend) -> None:
    assert number_to_words("1234") == "one thousand, two hundred and thirty-four"
    assert number_to_words("21") == "twenty-one"
    segs = fe.normalize("I have 3 cats")
    assert segs == ["I have three cats."]
    assert fe.normalize("a<|endofprompt|>b 1") == ["a<|endofprompt|>b 1"]
    assert fe.normalize("你好 世界（测试），") == ["你好世界测试。"]


def test_split_paragraph_packing() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(12))
    segs = split_paragraph(text, len, "en", token_max_n=80, token_min_n=60, merge_len=20)
    assert "".join(segs) == text
    assert all(len(s) <= 110 for s in segs) and len(segs) > 1
    assert split_paragraph("Hi. Ok", len, "en") == ["Hi. Ok."]
