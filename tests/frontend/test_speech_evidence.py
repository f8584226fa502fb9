"""The speakability shortcut against the real normalizer: a text it calls speakable is speakable.

:func:`~cosyclone.frontend.text_rules.evidently_speakable` lets validation (and so ``--dry-run``)
answer "is there anything to speak" without wetext when the raw text holds an ASCII letter or
digit or a CJK ideograph. The claim is pinned where it can fail: over a corpus (every input text of
the reference text vectors, the deviations table, the line-end fixtures, the texts of
``benchmarks/bench_manifest``, every printable ASCII character alone, beside a letter or digit and
in pairs with the other non-letters, and hand-picked tricky cases) the real normalizer runs, and
whenever the shortcut says "speakable" the normalized text must have speech (wetext and the "none"
frontend); ``text_problem`` must answer every text the same with and without the shortcut. A
``--dry-run`` normalizes only the texts the shortcut cannot answer; a run's opening, every text.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosyclone.frontend import normalize
from cosyclone.frontend.normalize import get_normalizer
from cosyclone.frontend.text import MODES, text_problem
from cosyclone.frontend.text_rules import EVIDENCE_MAX_DIGITS, evidently_speakable, has_markup, has_speech
from cosyclone.options import Mode, TextFrontendName
from tests.text_table import deviations

ROOT = Path(__file__).resolve().parents[2]
TRICKY = [
    "Mr.",
    "St.",
    "e.g.",
    "a",
    "I",
    "x-y",
    "3%",
    "$5",
    "½",
    "²",
    "%",
    "$$",
    "…",
    "😀",
    "😀 😀.",
    "...",
    "-",
    "#",
    "@",
    "&",
    "Dr. No",
    "i.e.",
    "U.S.",
    "A.",
    "No. 5",
    "#1",
    "1st",
    "2nd",
    "3rd",
    "4th",
    "100%",
    "$0.99",
    "£5",
    "€10",
    "¥20",
    "10:30",
    "12/25",
    "1/2",
    "3.14",
    "-7",
    "+1",
    "1e10",
    "0x1F",
    "x",
    "X",
    "q",
    "II",
    "IV",
    "XIV",
    "Chapter XIV.",
    "www.example.com",
    "a@b.c",
    "http://x.y",
    "C++",
    "C#",
    "R&D",
    "AT&T",
    "2024年3月15日",
    "今天是2024年3月15日。",
    "第3章",
    "3个",
    "价格是$5。",
    "共100%。",
    "1",
    "一",
    "A1",
    "1A",
    "mm",
    "km/h",
    "5km",
    "°C",
    "5°C",
    "30°",
    "9" * EVIDENCE_MAX_DIGITS,
    "a " + "1" * EVIDENCE_MAX_DIGITS,
    "9" * 33,
    "9" * 34,
    "a " + "9" * 40,
    "1" * 40 + "%",
    "a " + "1" * 40 + "%",
    "1" * EVIDENCE_MAX_DIGITS + "%",
    "a " + "1" * EVIDENCE_MAX_DIGITS + "%",
    "1e40",
    "1E+40",
    "10^40",
    "$" + "9" * EVIDENCE_MAX_DIGITS,
    "１２３",
    "١٢٣",
    "Ⅻ",
    "ⅻ",
    "①",
    "Ⓐ",
    "ａｂｃ",
    "ß",
    "é",
    "Ω",
    "π",
    "∞",
    "\t a \n",
    "a\r\nb",
    "two  spaces",
    "x\n\ny",
    "item #3",
    "'",
    '"a"',
    "(a)",
    "[1]",
    "{x}",
    "<a>",
    "a|b",
    "\\",
    "a\\b",
    "`a`",
    "~",
    "^",
    "*",
    "_a_",
    "a_b",
    "=",
    "1=1",
    "a=b",
    "?!",
    "a?",
    "1?",
    "Ok!",
    "ok.",
]


def _ascii_texts() -> Iterator[str]:
    """Every printable ASCII character alone, beside a letter or a digit, and in pairs with every
    character that is not a letter (digits and symbols meet there: "3%", "$5", "1/")."""
    printable = [c for c in string.printable if c.isprintable()]
    others = [c for c in printable if not c.isalpha()]
    for c in printable:
        yield c
        for x in ("a", "I", "x", "0", "5"):
            yield c + x
            yield x + c
    for a in others:
        for b in others:
            yield a + b


def _bench_texts(n: int = 400) -> Iterator[str]:
    from benchmarks.bench_manifest import PROMPT_TEXTS, row_text

    rng = random.Random(0)
    yield from PROMPT_TEXTS
    for i in range(n):
        yield row_text(rng, i * 997)  # numbers of every width the 200,000-row manifest has


def _local_corpus() -> list[str]:
    controls = json.loads((ROOT / "tests" / "fixtures" / "text_controls.json").read_text(encoding="utf-8"))[
        "cases"
    ]
    table = [d.input for d in deviations() if d.vector_name is None]
    texts = [*TRICKY, *table, *(c["text"] for c in controls), *_bench_texts(), *_ascii_texts()]
    return list(dict.fromkeys(t for t in texts if isinstance(t, str)))


def _answer(mode: Mode, text: str, kind: TextFrontendName) -> str | None:
    """``text_problem``'s answer, or the exception it raises (a row's error then says so)."""
    try:
        return text_problem(mode, text, text_frontend=kind)
    except Exception as exc:
        return f"raises {type(exc).__name__}"


def _check(texts: list[str], monkeypatch: pytest.MonkeyPatch, kind: TextFrontendName = "wetext") -> int:
    """Assert the claim over ``texts`` with the ``kind`` normalizer; returns how many the shortcut
    answered."""
    norm = get_normalizer(kind)
    answered = 0
    for text in texts:
        if not text.strip() or has_markup(text) or not evidently_speakable(text):
            continue
        answered += 1
        got = norm.normalize(text).text  # must not raise: the row's error would change
        assert has_speech(got), f"{text!r} was called speakable, but normalizes to {got!r}"
    with_shortcut = {(m, t): _answer(m, t, kind) for t in texts for m in MODES}
    monkeypatch.setattr(normalize, "evidently_speakable", lambda text: False)
    without = {(m, t): _answer(m, t, kind) for t in texts for m in MODES}
    differ = [k for k in with_shortcut if with_shortcut[k] != without[k]]
    assert not differ, f"text_problem answers differently with the shortcut: {differ[:5]}"
    return answered


@pytest.mark.parametrize("kind", ["wetext", "none"])
def test_the_shortcut_is_sound_on_the_corpus(kind: TextFrontendName, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = _local_corpus()
    answered = _check(texts, monkeypatch, kind)
    assert answered > len(texts) // 2  # the shortcut is in use, not vacuous


def test_the_shortcut_is_sound_on_the_reference_texts(reference_set, monkeypatch: pytest.MonkeyPatch) -> None:
    vectors = json.loads((reference_set("text") / "vectors.json").read_text(encoding="utf-8"))
    texts = [t["text"] for t in vectors["texts"]]
    texts += [c[k] for c in vectors["cases"] for k in ("text", "prompt_text", "instruct_text") if c.get(k)]
    assert _check(list(dict.fromkeys(texts)), monkeypatch) > 0


@pytest.mark.parametrize("text, expected", [
    ("Hello", True), ("3%", True), ("$5", True), ("今天", True), ("a", True),
    ("9" * EVIDENCE_MAX_DIGITS, True),
    ("%", False), ("$$", False), ("…", False), ("😀", False), ("²", False), ("½", False), ("ａｂｃ", False),
    ("é", False), ("9" * (EVIDENCE_MAX_DIGITS + 1), False), ("a " + "9" * 40, False), ("", False)])
def test_what_counts_as_evidence(text: str, expected: bool) -> None:
    assert evidently_speakable(text) is expected


def test_a_dry_run_of_ordinary_texts_normalizes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        tiny_model_dir: Path, normalized: list[str]) -> None:
    """``--dry-run`` (``plan_only``) neither normalizes nor starts the pool for texts the shortcut
    answers; the one text it cannot answer is normalized, and the plan is that of a run's opening."""
    from cosyclone.manifest import text_pool
    from cosyclone.run.job import SynthJob
    from tests.manifest.test_manifest_stream import rows_of, write

    monkeypatch.setenv("COSYCLONE_CACHE_DIR", str(tmp_path / "cache"))
    started: list[int] = []
    monkeypatch.setattr(text_pool.NormalizePool, "_start", lambda self: started.append(1) or None)  # type: ignore[func-returns-value]
    monkeypatch.setattr(text_pool, "MIN_POOL_TEXTS", 3)  # a pool for more than two texts
    get_normalizer("wetext")._memo.clear()
    texts = [f"Row {i} costs ${i}.50, see you at 10:{i % 50 + 10}." for i in range(600)] + ["…", "½"]
    path = write(tmp_path / "m", rows_of(texts))
    plan = SynthJob.open(
        path, tmp_path / "out", model_dir=tiny_model_dir, device="cpu", plan_only=True
    ).plan()
    assert sorted(normalized) == ["½", "…"] and started == []
    assert (plan.valid_rows, plan.rejected) == (601, 1)  # "…" has nothing to speak, "½" is "one half"
    normalized.clear()
    get_normalizer("wetext")._memo.clear()
    full = SynthJob.open(path, tmp_path / "out2", model_dir=tiny_model_dir, device="cpu").plan()
    # a run normalizes every text ahead (on the pool, were it not stubbed here), for its frontend; the
    # dry run's two are in the content cache already
    assert sorted(normalized) == sorted(texts[:600]) and started
    assert (full.valid_rows, full.rejected, full.batches) == (plan.valid_rows, plan.rejected, plan.batches)
