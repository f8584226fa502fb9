"""What the LLM reads, against the official frontend's recorded outputs (vectors/text/vectors.json).

Every case is checked by one rule (docs/text_frontend.md): a row written as the official README
writes it must give the official ids; a row that leaves the system prefix out must give the ids of
the same row with it; a case in the deviations table must give the table's cosyclone column, and a
case the official code cannot speak must be a per-row error. The vectors and the Qwen2 vocabulary
they were made with come from the one resolver (``tests/reference.py``): missing files skip these
tests with the shared reason, or fail them under ``COSYCLONE_REQUIRE_REFERENCE=1`` (``.ci/run``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cosyclone.frontend.normalize import get_normalizer
from cosyclone.frontend.text import TextFrontend
from cosyclone.frontend.text_rules import TextError
from cosyclone.model.config import ENDOFPROMPT, SYSTEM_PREFIX
from cosyclone.options import Mode
from tests.reference import reference_set, reference_tokenizer
from tests.text_table import VARIANTS, Deviation, deviations

MODE_OF: dict[str, Mode] = {
    "zs_zh": "zero_shot",
    "zs_en": "zero_shot",
    "zs_en_noprefix": "zero_shot",
    "xl_prefix": "cross_lingual",
    "xl_noprefix": "cross_lingual",
    "instruct2": "instruct2",
}


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    return json.loads((reference_set("text") / "vectors.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def fe(vectors: dict[str, Any]) -> TextFrontend:
    return TextFrontend(reference_tokenizer())


def _table() -> dict[tuple[str, str], Deviation]:
    out = {}
    for row in deviations():
        if row.vector_name is not None:
            for variant in row.modes:
                assert variant in VARIANTS, f"row {row.number}: unknown variant {variant!r}"
                out[(row.vector_name, variant)] = row
    return out


def _prefixed(case: dict[str, Any]) -> bool:
    """Whether the case is written as the official README writes it (the system prefix is there)."""
    mode = MODE_OF[case["variant"]]
    given = {
        "zero_shot": case["prompt_text"],
        "cross_lingual": case["text"],
        "instruct2": case["instruct_text"],
    }[mode]
    return ENDOFPROMPT in (given or "")


def expected(case: dict[str, Any], cases: list[dict[str, Any]], fe: TextFrontend) -> tuple[list, list] | str:
    """(prompt ids, segment ids) the rule asks for, or "error" (official: nothing to speak)."""
    official = case["official"]
    if not _prefixed(case):  # the same row with the prefix: its official ids
        if case["variant"] == "xl_noprefix":
            sibling = next(
                c for c in cases if c["text_index"] == case["text_index"] and c["variant"] == "xl_prefix"
            )
            return expected(sibling, cases, fe)
        assert case["variant"] == "zs_en_noprefix", case["variant"]
        # the official code passes a prefixed prompt through untouched (markup), so its ids are the tokens
        prompt = fe.encode(SYSTEM_PREFIX + case["prompt_text"])
        target = expected(
            {**case, "variant": "zs_en", "prompt_text": SYSTEM_PREFIX + case["prompt_text"]}, cases, fe
        )
        return target if isinstance(target, str) else (prompt, target[1])
    if official["error"] or not official["segments"] or "" in official["segments"]:
        return "error"
    return official["prompt_ids"], official["segment_ids"]


def ours(case: dict[str, Any], fe: TextFrontend) -> tuple[list, list, list[str]]:
    mode = MODE_OF[case["variant"]]
    plan = fe.plan(mode, case["prompt_text"], case["text"], case["instruct_text"], row_id=case["name"])
    return list(plan.prompt_ids), [list(s.ids) for s in plan.segments], [s.text for s in plan.segments]


def test_vectors_were_made_with_the_installed_versions(vectors: dict[str, Any]) -> None:
    env = vectors["meta"]["env"]
    got = get_normalizer("wetext").version()
    assert (got["wetext"], got["inflect"]) == (env["wetext"], env["inflect"])
    assert len(vectors["cases"]) == 6 * len(vectors["texts"]) and vectors["cases"]


def test_every_case_by_the_rule(vectors: dict[str, Any], fe: TextFrontend) -> None:
    cases = vectors["cases"]
    table = _table()
    failures: list[str] = []
    matched = deviated = 0
    for case in cases:
        key = (case["name"], case["variant"])
        row = table.get(key)
        try:
            got: tuple[list, list, list[str]] | str = ours(case, fe)
        except TextError as exc:
            got = f"error: {exc}"
        if row is not None:
            deviated += 1
            if row.expect == "prefix + zero_shot segments":
                zs = next(
                    c for c in cases if c["text_index"] == case["text_index"] and c["variant"] == "zs_en"
                )
                segments = [SYSTEM_PREFIX + s for s in zs["official"]["segments"]]
                ok = not isinstance(got, str) and got[2] == segments and got[0] == [] and all(
                    ids == fe.encode(t) for ids, t in zip(got[1], segments, strict=True))
            elif isinstance(row.expect, str) and row.expect.startswith("error: "):
                ok = isinstance(got, str) and row.expect.removeprefix("error: ") in got
            else:
                ok = not isinstance(got, str) and got[2] == row.expect
            if not ok:
                failures.append(f"{key}: table row {row.number} says {row.expect!r}, got {str(got)[:300]}")
            continue
        want = expected(case, cases, fe)
        if want == "error":
            ok = isinstance(got, str)
        else:
            ok = not isinstance(got, str) and (got[0], got[1]) == (want[0], want[1])
        matched += ok
        if not ok:
            failures.append(
                f"{key}: expected {str(want)[:200]}, got {str(got)[:300]} (not in the deviations table)"
            )
    assert not failures, "\n".join(failures)
    assert matched + deviated == len(cases) and deviated == len(table)


def test_table_rows_name_real_vector_cases(vectors: dict[str, Any]) -> None:
    names = {c["name"] for c in vectors["cases"]}
    for (name, _variant), row in _table().items():
        assert name in names, f"table row {row.number} names {name!r}, not in the vectors"


def test_chunked_normalization_equals_whole_text_normalization(vectors: dict[str, Any]) -> None:
    """Sentence chunks give wetext's whole-text output: on each text, and on all of them joined."""
    from cosyclone.frontend import text_rules as nz

    norm = get_normalizer("wetext")
    en = [t["text"] for t in vectors["texts"] if t["text"].strip() and not nz.contains_chinese(t["text"])]
    zh = [t["text"] for t in vectors["texts"] if nz.contains_chinese(t["text"])]
    long_texts = [t["text"] for t in vectors["texts"] if len(t["text"]) > nz.CHUNK_CHARS]
    joined = [" ".join(en), "".join(zh), " ".join(en + zh)]
    chunked = 0
    for text in long_texts + joined:
        text = text.strip()
        lang = norm._wetext_utils.get_lang(text)
        chunked += len(nz.sentence_chunks(text, lang)) > 1
        whole = norm._try_tn(text, lang)
        assert whole is not None and norm._tn(text) == whole, text[:60]
    assert chunked >= len(joined) + 1  # the joined texts and en_5000 are cut (zh_no_punct_300 has no mark)
