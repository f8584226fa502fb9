"""Hostile manifest lines are each that line's error; the lines around them are still rows.

Every case here once ended a run or was accepted silently: a lone surrogate (the fingerprint
raised), a line nested thousands deep (the JSON parser recursed), one Latin-1 byte (the whole file
was refused), control and bidi characters, duplicate keys (the last one won), seeds beyond 64 bits.
"""

from __future__ import annotations

import json
from pathlib import Path

from cosyclone.manifest import read_manifest, rows_from_dicts
from cosyclone.manifest.rows import SEED_MAX, SPOKEN_WHITESPACE, text_field_problem

ROOT = Path(__file__).resolve().parents[2]
PROMPT = str(ROOT / "manifests" / "prompts" / "speaker1.wav")


def good(rid: str, **extra: object) -> str:
    return json.dumps({"id": rid, "prompt_audio": PROMPT, "prompt_text": "reference words",
                       "text": "A plain sentence to speak.", **extra})


#: (raw line bytes, the field the error names or None, words its message holds)
HOSTILE: dict[str, tuple[bytes, str | None, str]] = {
    "lone_surrogate": (good("s", text="abc\ud800def").encode(), "text", "lone surrogate"),
    "deep_nesting": (b'{"id": "d", "instruct": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "levels deep"),
    "latin1_byte": (
        good("l", text="a cafe").encode().replace(b"cafe", b"caf\xe9"),
        None,
        "not UTF-8: byte 0xe9",
    ),
    "nul": (good("n", text="a\u0000b").encode(), "text", "control character"),
    "c0_bell": (good("b", prompt_text="ring \u0007").encode(), "prompt_text", "control character"),
    "c1_control": (
        good("c", instruct="x\u0085y", mode="instruct2").encode(),
        "instruct",
        "control character",
    ),
    "bidi_override": (good("o", text="evil \u202etxt.exe").encode(), "text", "bidi control"),
    "bidi_isolate": (good("i", text="a\u2066b\u2069").encode(), "text", "bidi control"),
    "duplicate_key": (
        b'{"id": "k", "prompt_audio": "x.wav", "text": "a", "text": "b"}',
        "text",
        "duplicate key",
    ),
    "seed_2_64": (good("e", seed=2**64).encode(), "seed", "0..2**64-1"),
    "seed_5000_digits": (good("f").encode()[:-1] + b', "seed": ' + b"9" * 5000 + b"}", None, "5000 digits"),
    "nan_speed": (good("g").encode()[:-1] + b', "speed": NaN}', None, "NaN is not a JSON number"),
    "id_with_surrogate": (good("x\udc80y").encode(), "id", "lone surrogate"),
    "raw_surrogate_bytes": (
        good("r", text="a b").encode().replace(b"a b", b"a \xed\xa0\x80"),
        None,
        "not UTF-8",
    ),
    "id_bidi": (good("a\u202eb").encode(), "id", "bidi control"),
    "path_surrogate": (
        json.dumps({"id": "p", "prompt_audio": "a\udfffb.wav", "prompt_text": "w", "text": "t"}).encode(),
        "prompt_audio",
        "lone surrogate",
    ),
    "c0_unit_separator": (good("u", text="a\u001fb").encode(), "text", "control character"),
    "path_cr": (
        json.dumps({"id": "q", "prompt_audio": "a\rb.wav", "prompt_text": "w", "text": "t"}).encode(),
        "prompt_audio",
        "control character",
    ),
}


def _manifest(tmp_path: Path, lines: list[bytes]) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_each_hostile_line_is_its_own_error_and_the_good_rows_stay(tmp_path: Path) -> None:
    names = list(HOSTILE)
    lines = [good("first").encode()] + [HOSTILE[n][0] for n in names] + [good("last").encode()]
    m = read_manifest(_manifest(tmp_path, lines))
    assert [r.id for r in m.rows] == ["first", "last"]
    assert [r.line for r in m.rows] == [1, len(lines)]
    by_line = {e.line: e for e in m.errors if e.line is not None}
    assert sorted(by_line) == list(range(2, len(lines)))  # every hostile line, once
    for k, name in enumerate(names, start=2):
        _, field, words = HOSTILE[name]
        err = by_line[k]
        assert words in err.reason, (name, str(err))
        assert field is None or err.field == field, (name, str(err))
        assert str(err).startswith(f"line {k}")


def test_python_rows_get_the_same_refusals(tmp_path: Path) -> None:
    rows = [{"id": "a", "prompt_audio": PROMPT, "prompt_text": "w", "text": "abc\ud800"},
            {"id": "b", "prompt_audio": PROMPT, "prompt_text": "w", "text": "fine", "seed": 10**5000},
            {"id": "c", "prompt_audio": PROMPT, "prompt_text": "w", "text": "fine", "speed": float("nan")},
            {"id": "d", "prompt_audio": PROMPT, "prompt_text": "w", "text": "fine", 7: "a non-str key"},
            {"id": 10**5000, "prompt_audio": PROMPT, "text": "fine"},
            {"id": "ok", "prompt_audio": PROMPT, "prompt_text": "w", "text": "fine", "seed": SEED_MAX}]
    m = rows_from_dicts(rows)
    assert [r.id for r in m.rows] == ["ok"] and m.rows[0].seed == SEED_MAX
    reasons = {e.line: e for e in m.errors}
    assert "lone surrogate" in reasons[1].reason and reasons[1].field == "text"
    assert reasons[2].field == "seed" and "2**64-1" in reasons[2].reason
    assert reasons[3].field == "speed"
    assert reasons[4].field == "7" and "unknown field" in reasons[4].reason
    assert reasons[5].field == "id" and "must be a string" in reasons[5].reason


def test_tab_newline_and_the_rtl_marks_are_kept() -> None:
    assert text_field_problem("one\ttwo\nthree") is None
    assert "U+000D" in str(text_field_problem("a\r\nb"))  # a path keeps only tab and newline
    assert text_field_problem("line\r\nnext\rcell\tpage\fvt\v", whitespace=SPOKEN_WHITESPACE) is None
    assert "U+0000" in str(text_field_problem("a\x00b", whitespace=SPOKEN_WHITESPACE))
    assert (
        text_field_problem("\u05e9\u05dc\u05d5\u05dd\u200f \u0645\u0631\u062d\u0628\u0627\u061c \u200e")
        is None
    )
    assert text_field_problem("family \U0001f468\u200d\U0001f469") is None  # ZWJ is not a control
    assert "U+202E RIGHT-TO-LEFT OVERRIDE, at character 2" in str(text_field_problem("a\u202e"))


def test_spoken_fields_keep_line_ends_tabs_and_page_breaks(tmp_path: Path) -> None:
    """CR, CRLF, tab, VT and FF in text, prompt_text and instruct are read as officially
    (docs/text_frontend.md)."""
    rows = [
        good("zs", text="Hello there.\r\nHow are you?\tFine.\v\fBye.", prompt_text="Line one\r\nline\ttwo\r"),
        good("ins", mode="instruct2", instruct="Speak softly.\r\nSlowly.\t\v\f", text="第一行\r\n第二行"),
        good("xl", mode="cross_lingual", text="Tab\tand\rreturn."),
    ]
    m = read_manifest(_manifest(tmp_path, [r.encode() for r in rows]))
    assert not m.errors and [r.id for r in m.rows] == ["zs", "ins", "xl"]
    assert m.rows[0].text == "Hello there.\r\nHow are you?\tFine.\v\fBye."  # handed on as written
    assert m.rows[1].instruct == "Speak softly.\r\nSlowly.\t\v\f"


def test_blank_lines_crlf_and_a_bom_are_not_errors(tmp_path: Path) -> None:
    lines = [b"\xef\xbb\xbf" + good("bom").encode(), b"", b"   ", good("crlf").encode() + b"\r"]
    m = read_manifest(_manifest(tmp_path, lines))
    assert [r.id for r in m.rows] == ["bom", "crlf"] and not m.errors
    assert [r.line for r in m.rows] == [1, 4]


def test_a_line_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    huge = good("h", text="word " * 250_000).encode()
    m = read_manifest(_manifest(tmp_path, [huge, good("after").encode()]))
    assert [r.id for r in m.rows] == ["after"] and "bytes; a manifest row is at most" in m.errors[0].reason
