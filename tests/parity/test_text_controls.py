"""Line ends, tabs and page breaks in a row's texts, against the official frontend's own outputs.

``tests/fixtures/text_controls.json`` pins what the official text functions (FunAudioLLM/CosyVoice
ace7c47, run unchanged with wetext 0.1.8, inflect 7.6.0 and the reference Qwen2 tokenizer; its
``meta`` says how) give for ``\\r\\n``, ``\\r``, ``\\t``, ``\\v`` and ``\\f`` in ``text``, ``prompt_text``
and ``instruct``: the segments and the ids the LLM reads. The reference vectors hold no such case,
so these outputs were recorded the same way the vectors were, on inputs chosen for this.

Where the official code reads the input, cosyclone must give exactly its segments and ids. Where it
raises (wetext's English grammar has no path through ``\\r\\n``, nor through some whitespace runs),
the case names the input whose official output is expected instead (``read_as``): the same text
with LF line ends, or with each whitespace run made one space (docs/text_frontend.md, deviations
6, 7, 20 and 21). The manifest must let every such text through (``text_field_problem``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cosyclone.frontend.text import TextFrontend
from cosyclone.manifest.rows import SPOKEN_WHITESPACE, text_field_problem
from tests.reference import reference_tokenizer

TABLE = Path(__file__).resolve().parents[1] / "fixtures" / "text_controls.json"
CASES: list[dict[str, Any]] = json.loads(TABLE.read_text(encoding="utf-8"))["cases"]
ZS_PROMPT = "You are a helpful assistant.<|endofprompt|>Reference words."


@pytest.fixture(scope="module")
def fe() -> TextFrontend:
    return TextFrontend(reference_tokenizer())


def _ident(case: dict[str, Any]) -> str:
    return f"{case['mode']}:{case.get('prompt_text') or case.get('instruct') or case['text']!r}"[:60]


def test_the_table_covers_every_kept_control_in_every_spoken_field() -> None:
    def where(ch: str) -> set[str]:
        return {f for c in CASES for f in ("text", "prompt_text", "instruct") if ch in (c.get(f) or "")}

    assert {f for ch in "\r\t\v\f" for f in where(ch)} == {"text", "prompt_text", "instruct"}
    for ch in "\r\t\v\f":
        assert "text" in where(ch), repr(ch)
    assert any("\r\n" in c["text"] and c["official"].startswith("raises") for c in CASES)  # the deviation
    assert any("\r\n" in c["text"] and c["official"] == "as written" and "\r" in "".join(c["segments"])
               for c in CASES)  # Chinese keeps the \r of a \r\n, as officially


@pytest.mark.parametrize("case", CASES, ids=_ident)
def test_same_llm_input_as_the_official_frontend(case: dict[str, Any], fe: TextFrontend) -> None:
    for field in ("text", "prompt_text", "instruct"):
        if case.get(field):
            assert text_field_problem(case[field], whitespace=SPOKEN_WHITESPACE) is None, field
    plan = fe.plan(case["mode"], case.get("prompt_text") or ZS_PROMPT, case["text"], case.get("instruct"))
    assert [s.text for s in plan.segments] == case["segments"]
    assert [list(s.ids) for s in plan.segments] == case["segment_ids"]
    if "prompt_ids" in case:
        assert list(plan.prompt_ids) == case["prompt_ids"]
    if case["official"] != "as written":  # a documented deviation: what the official code reads instead
        assert case["official"].startswith("raises ") and case["read_as"] in (
            "LF line ends", "whitespace runs as one space")
