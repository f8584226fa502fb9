"""The text side: official normalization rules, the per-mode rule, deviations, loading, splitting."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from cosyclone.errors import CosycloneError
from cosyclone.frontend.normalize import TextNormalizer, get_normalizer
from cosyclone.frontend.text import SPECIAL_TOKENS, TextFrontend, instruct_prompt, text_problem
from cosyclone.frontend.text_rules import (
    TextError,
    drop_blanks,
    has_speech,
    is_only_punctuation,
    sentence_chunks,
    spell_numbers,
    split_paragraph,
    unescape_wetext,
)
from cosyclone.frontend.tiny_assets import write_tiny_tokenizer
from cosyclone.model.config import SYSTEM_PREFIX
from cosyclone.options import Mode
from tests.text_table import deviations

PROMPT = SYSTEM_PREFIX + "希望你以后能够做的比我还好呦。"


@pytest.fixture(scope="module")
def fe(tmp_path_factory: pytest.TempPathFactory) -> TextFrontend:
    return TextFrontend(write_tiny_tokenizer(tmp_path_factory.mktemp("qwen")))


def texts(
    fe: TextFrontend, mode: Mode, text: str, prompt: str | None = PROMPT, instruct: str = "Speak."
) -> list[str]:
    return [s.text for s in fe.plan(mode, prompt, text, instruct).segments]


# -- tokenizer ----------------------------------------------------------------------------------


def test_special_ids(fe: TextFrontend) -> None:
    ids = fe.tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|endofprompt|>", "[breath]",
                                              "<|endofsystem|>", "[AA]", "[a]", "[ǜ]"])
    assert ids == [151643, 151646, 151647, 151663, 151664, 151748, 151923]
    assert len(SPECIAL_TOKENS) == 280 and max(ids) < 151936
    assert fe.encode("x<|endofprompt|>[breath]")[-2:] == [151646, 151647]


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


# -- the normalizer is required, and it is wetext ------------------------------------------------


def test_installed_package_normalizes_numbers_with_wetext() -> None:
    import wetext  # a required dependency: imported, never skipped

    assert wetext.Normalizer  # the class the frontend builds
    norm = get_normalizer("wetext")
    assert norm.version()["wetext"] == "0.1.8" and norm.version()["inflect"] == "7.6.0"
    # Readings only wetext's grammars make (inflect alone gives "$five.twenty", "ten:thirty", digits in
    # Chinese).
    assert norm.normalize("It costs $5.20.").text == "It costs five point two dollars."
    assert norm.normalize("Meet at 10:30 pm.").text == "Meet at ten thirty PM."
    assert norm.normalize("今天是2024年3月15日。").text == "今天是二零二四年三月十五日。"
    assert norm.normalize("1,000,000").text == "one million"


def test_none_frontend_is_the_official_code_without_a_normalizer() -> None:
    norm = get_normalizer("none")
    assert norm.normalize("It costs $5.20 at 10:30.").text == "It costs $five.twenty at ten:thirty."
    assert norm.normalize("今天是2024年3月15日。").text == "今天是2024年3月15日。"
    assert get_normalizer("none") is norm and get_normalizer("wetext") is get_normalizer("wetext")


def test_missing_normalizer_fails_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wetext", None)  # "import wetext" now raises ImportError
    with pytest.raises(TextError, match="wetext==0.1.8"):
        TextNormalizer("wetext")
    monkeypatch.setitem(sys.modules, "inflect", None)
    with pytest.raises(TextError, match="inflect==7.6.0"):
        TextNormalizer("none")
    with pytest.raises(TextError, match="wetext, none"):
        TextNormalizer("ttsfrd")  # type: ignore[arg-type]


def test_broken_normalizer_fails_its_self_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import wetext

    monkeypatch.setattr(wetext.Normalizer, "normalize", lambda self, text, **kw: text)
    with pytest.raises(TextError, match="does not spell numbers"):
        TextNormalizer("wetext")


# -- official rules -------------------------------------------------------------------------------


def test_split_drops_repeated_marks_and_keeps_closing_quotes() -> None:
    def count(s: str) -> int:
        return len(s.split())

    assert split_paragraph("Wait... what did you say? Really?!", "en", count) == [
        "Wait. what did you say? Really?"
    ]
    assert split_paragraph("真的吗？！太好了！！！", "zh", count) == ["真的吗？太好了！"]
    assert split_paragraph("She asked, “Are you sure?”", "en", count) == ["She asked, “Are you sure?”"]
    assert split_paragraph("他问：“真的吗？！”", "zh", count) == ["他问：“真的吗？”"]
    assert split_paragraph("Hello world", "en", count) == ["Hello world."]
    assert split_paragraph("", "en", count) == []


def test_split_packs_sentences_between_the_official_bounds() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    segs = split_paragraph(text, "en", len)  # length in characters for the test
    assert "".join(segs) == text and len(segs) > 1
    assert all(60 < len(s) <= 80 + 30 for s in segs[:-1])
    tail = split_paragraph("A" * 70 + ". Short.", "en", len)
    assert tail == ["A" * 70 + ". Short."]  # a tail under 20 joins the previous segment


def test_whitespace_and_digit_tests_are_the_official_ones() -> None:
    assert drop_blanks("中文 中文") == "中文中文"
    assert drop_blanks("Open AI 的 GPT") == "Open AI的GPT"
    assert drop_blanks("中文\t 中文") == "中文\t中文"  # the space beside 中 goes, the tab stays
    assert drop_blanks("a \tb") == "a \tb"  # a space beside a tab has ASCII neighbours: kept
    # isdigit covers full width
    assert spell_numbers("Room １２３.", lambda d: f"<{int(d)}>") == "Room <123>."
    assert is_only_punctuation("？！…") and is_only_punctuation("😀👍") and is_only_punctuation("")
    assert not is_only_punctuation("😀 😀")
    assert not has_speech("😀 😀.") and has_speech("[breath]") and not has_speech("<|endofprompt|>")


def test_markup_switches_normalization_off(fe: TextFrontend) -> None:
    assert fe.segments("Some text with <|im_start|> inside 123.") == [
        "Some text with <|im_start|> inside 123."
    ]
    assert fe.segments("I have 3 cats") == ["I have three cats."]
    assert fe.segments("你好 世界（测试），") == ["你好世界测试。"]
    assert fe.segments("等一下...再说。") == ["等一下。再说。"]  # "." becomes "。" before splitting


def test_wetext_escaping_is_undone_exactly() -> None:
    from wetext.token_parser import escape_value  # wetext's own escaping

    rng = random.Random(0)
    for _ in range(500):
        s = "".join(rng.choice('ab"\\ x”') for _ in range(rng.randint(0, 12)))
        assert unescape_wetext(escape_value(s)) == s


def test_sentence_chunks_cover_the_text_at_safe_ends() -> None:
    text = (
        "Dr. Chen came at 9 a.m. on Monday. The team met, e.g. twice. Nobody ever missed it. " * 12
    ).strip()
    chunks = sentence_chunks(text, "en", chunk_chars=100)
    assert "".join(chunks) == text and len(chunks) > 3
    assert all(not c.rstrip().endswith(("Dr.", "a.m.", "e.g.")) for c in chunks[:-1])
    zh = "今天是2024年3月15日。天气很好！" * 20
    zchunks = sentence_chunks(zh, "zh", chunk_chars=50)
    assert "".join(zchunks) == zh and all(c.endswith(("。", "！")) for c in zchunks)
    assert sentence_chunks("short.", "en") == ["short."]


def test_normalization_is_memoized() -> None:
    norm = get_normalizer("wetext")
    text = "A text only this test normalizes, 42 times."
    first = norm.normalize(text)
    assert norm.normalize(text) is first


# -- one rule for every mode ------------------------------------------------------------------------


def test_zero_shot_prompt_gets_the_prefix_once_and_verbatim(fe: TextFrontend) -> None:
    with_prefix = fe.plan("zero_shot", SYSTEM_PREFIX + "I paid $2 at 10:30.", "Hello world.")
    without = fe.plan("zero_shot", "I paid $2 at 10:30.", "Hello world.")
    assert (
        without.prompt_ids
        == with_prefix.prompt_ids
        == tuple(fe.encode(SYSTEM_PREFIX + "I paid $2 at 10:30."))
    )
    assert without.prompt_text == SYSTEM_PREFIX + "I paid $2 at 10:30."  # not normalized, as officially
    assert [s.text for s in without.segments] == ["Hello world."]


def test_cross_lingual_reads_the_prefix_in_front_of_the_text(fe: TextFrontend) -> None:
    plan = fe.plan("cross_lingual", None, "Hello 2024")
    assert plan.prompt_ids == () and [s.text for s in plan.segments] == [SYSTEM_PREFIX + "Hello 2024"]
    assert fe.plan("cross_lingual", "ignored", SYSTEM_PREFIX + "Hello 2024") == plan


def test_long_cross_lingual_text_is_split_with_the_prefix_on_every_segment(fe: TextFrontend) -> None:
    text = " ".join(f"Sentence {i} has about ten words in it, more or less." for i in range(60))
    zero_shot = texts(fe, "zero_shot", text)
    cross = texts(fe, "cross_lingual", text)
    assert len(zero_shot) > 5
    assert cross == [SYSTEM_PREFIX + s for s in zero_shot]
    assert texts(fe, "cross_lingual", SYSTEM_PREFIX + text) == cross


def test_instruct2_prompt(fe: TextFrontend) -> None:
    official = "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"
    assert instruct_prompt("请用广东话表达。") == official
    assert instruct_prompt(official) == official
    assert instruct_prompt("You are a helpful assistant. 请用广东话表达。") == official
    plan = fe.plan("instruct2", None, "好少咯。", "请用广东话表达。")
    assert plan.prompt_ids == tuple(fe.encode(official))


def test_rows_that_cannot_be_spoken_are_errors_in_every_mode(fe: TextFrontend) -> None:
    for mode in ("zero_shot", "cross_lingual", "instruct2"):
        for bad in ("   ", "😀😀😀", "...", "？！"):
            with pytest.raises(TextError, match="row 'r'"):
                fe.plan(mode, PROMPT, bad, "Speak.", row_id="r")
            assert text_problem(mode, bad) is not None
    with pytest.raises(TextError, match="prompt transcript"):
        fe.plan("zero_shot", None, "x")
    with pytest.raises(TextError, match="instruction"):
        fe.plan("instruct2", None, "x")
    with pytest.raises(TextError, match="unknown mode"):
        fe.plan("sft", None, "x")  # type: ignore[arg-type]


def test_a_segment_that_cannot_fit_is_refused(fe: TextFrontend) -> None:
    plan = fe.plan("zero_shot", PROMPT, "这是一段没有任何标点符号的很长的中文文本" * 5)
    assert len(plan.segments) == 1  # no sentence mark: the official splitter cannot cut it
    need = plan.positions(0, prompt_speech_tokens=100, max_len_ratio=20.0)
    plan.check_fit(max_positions=need, max_len_ratio=20.0, prompt_speech_tokens=100)
    with pytest.raises(TextError, match=r"row 'r': segment 1 of 1 .* Add sentence punctuation"):
        plan.check_fit(max_positions=need - 1, max_len_ratio=20.0, prompt_speech_tokens=100, row_id="r")


# -- the deviations table ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row", [r for r in deviations() if r.vector_name is None], ids=lambda r: f"row{r.number}"
)
def test_documented_deviation(fe: TextFrontend, row) -> None:
    """Each literal row of docs/text_frontend.md's table gives exactly its cosyclone column."""
    (mode,) = row.modes
    if isinstance(row.expect, str):
        assert row.expect.startswith("error: ")
        with pytest.raises(TextError, match=row.expect.removeprefix("error: ")):
            fe.plan(mode, PROMPT, row.input, "Speak.")
    else:
        assert texts(fe, mode, row.input) == row.expect


# -- manifest validation ----------------------------------------------------------------------------


def test_manifest_refuses_texts_with_nothing_to_speak_by_line(tmp_path: Path) -> None:
    import json

    from cosyclone.manifest import read_manifest

    # no prompt_text
    rows = [
        {"id": "ok", "prompt_audio": "p.wav", "mode": "cross_lingual", "text": "Hello."},
        {"id": "emoji", "prompt_audio": "p.wav", "prompt_text": "hi", "text": "😀😀😀"},
        {"id": "dots", "prompt_audio": "p.wav", "mode": "instruct2", "instruct": "Softly.", "text": "..."},
        {"id": "twice", "prompt_audio": "p.wav", "prompt_text": "hi", "text": SYSTEM_PREFIX + "Hello."},
        {"id": "bare", "prompt_audio": "p.wav", "mode": "cross_lingual", "text": SYSTEM_PREFIX + " "},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    m = read_manifest(path, check_audio=False)
    assert [r.id for r in m.rows] == ["ok"] and m.rows[0].prompt_text == ""
    got = {e.line: (e.row_id, e.field, e.reason) for e in m.errors}
    assert got[2] == ("emoji", "text", "text has nothing to speak (only punctuation, symbols or emoji)")
    assert got[3][0] == "dots" and "nothing to speak" in got[3][2]
    assert got[4][0] == "twice" and "belongs in prompt_text" in got[4][2]
    assert got[5][0] == "bare" and "nothing after the system prefix" in got[5][2]
