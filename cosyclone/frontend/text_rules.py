"""The official text rules of the CosyVoice3 frontend, as pure functions: what counts as speech,
Chinese clean-up, spelling numbers, sentence marks and cutting a text into segments.

Split from :mod:`cosyclone.frontend.normalize`, which applies them around wetext and inflect
(:class:`~cosyclone.frontend.normalize.TextNormalizer`); the algorithm and its deviations are
described there and in docs/text_frontend.md. Both modules' sources are part of the text cache's key.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

import regex

from cosyclone.errors import CosycloneError

ZH_MARKS = frozenset("。？！；：、.?!;")  # sentence marks of the Chinese splitter
EN_MARKS = frozenset(".?!;:")  # sentence marks of the other splitter
CLOSING_QUOTES = frozenset('"”')  # a quote right after a mark belongs to that piece
TOKEN_MAX_N, TOKEN_MIN_N, MERGE_LEN = 80, 60, 20  # the official splitter's packing bounds

_CHINESE = re.compile(r"[\u4e00-\u9fff]")
_SPEECH_EVIDENCE = re.compile(r"[A-Za-z0-9\u4e00-\u9fff]")
_DIGIT = re.compile(r"\d")
EVIDENCE_MAX_DIGITS = 30  # inflect spells numbers up to 10**33 - 1 and raises above (NumOutOfRangeError)
_ONLY_PUNCT = regex.compile(r"[\p{P}\p{S}]*")
_TRAILING_COMMAS = re.compile(r"[，,、]+$")
_WETEXT_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_MARKUP_TAG = re.compile(r"<\|[^<>|]*\|>")
_WHITESPACE_RUN = re.compile(r"\s+")
CHUNK_CHARS = 240  # sentence chunks are packed up to this many characters per wetext call


class TextError(CosycloneError):
    """A text cannot be turned into something the model can speak."""


# ---------------------------------------------------------------------------------------------
# Character tests (the official ones, plus the "is there anything to say" test)


def contains_chinese(text: str) -> bool:
    """Whether ``text`` has a CJK unified ideograph (U+4E00..U+9FFF): the official language test."""
    return _CHINESE.search(text) is not None


def has_markup(text: str) -> bool:
    """The official switch: ``<|`` and ``|>`` anywhere turn normalization and splitting off."""
    return "<|" in text and "|>" in text


def is_only_punctuation(text: str) -> bool:
    """Empty, or only Unicode punctuation and symbols (emoji are symbols): the official filter."""
    return _ONLY_PUNCT.fullmatch(text) is not None


def has_speech(text: str) -> bool:
    """Whether ``text`` has a letter, mark or number once ``<|...|>`` tags are taken out.

    The official filter keeps "😀 😀." (the space is not punctuation); a model fed that makes
    noise, not speech, so a row whose segments all fail this test is refused.
    """
    return any(unicodedata.category(c)[0] in "LMN" for c in _MARKUP_TAG.sub("", text))


def evidently_speakable(text: str) -> bool:
    """Whether a markup-free ``text`` is sure to keep speech through normalization, seen without
    normalizing it: it holds an ASCII letter, an ASCII digit or a CJK ideograph (U+4E00..U+9FFF),
    and at most :data:`EVIDENCE_MAX_DIGITS` digits of any kind.

    Why it holds: neither step of :class:`~cosyclone.frontend.normalize.TextNormalizer` deletes
    such a character without putting words in its place. wetext rewrites what it reads (numbers,
    money, times, abbreviations: "3%" -> "three percent", "Mr." -> "mister") into words and leaves
    the rest as written; where it has no reading, the fallbacks of ``_tn_one`` keep the words as
    written. The Chinese steps after it only drop spaces, newlines, brackets and backticks, and
    inflect turns every digit run into words. So the normalized text still has a letter (category
    L), which is what :func:`has_speech` asks. The digit bound keeps out the one way normalizing
    can fail instead of answering: inflect raises on a number above 10**33 (a 34-digit run), and
    that row's error must stay what it was. Texts without this evidence ("%", "$$", "…", emoji,
    "²", "½") are normalized as before. Markup is not considered: a markup text is never
    normalized (:func:`has_markup`; ``speakable`` asks :func:`has_speech` of it directly).
    Validation of a manifest of ordinary texts then needs no wetext at all; the shortcut must agree
    with the real normalizer wherever it answers.
    """
    if _SPEECH_EVIDENCE.search(text) is None:
        return False
    return len(_DIGIT.findall(text)) <= EVIDENCE_MAX_DIGITS


# ---------------------------------------------------------------------------------------------
# The official rules, step by step


def drop_blanks(text: str) -> str:
    """Remove each ASCII space unless both neighbours are ASCII and not spaces (the Chinese rule).

    Only ``" "`` is considered: a tab stays, and counts as an ASCII neighbour, as officially.
    """
    def printable_ascii(c: str) -> bool:
        return c != "" and c != " " and c.isascii()

    out = []
    for i, c in enumerate(text):
        if c == " ":
            before = text[i - 1]  # at i == 0 the official code reads the last character too
            after = text[i + 1] if i + 1 < len(text) else ""  # (where the official code raises)
            if not (printable_ascii(before) and printable_ascii(after)):
                continue
        out.append(c)
    return "".join(out)


def chinese_rules(text: str) -> str:
    """The official steps after wetext for Chinese text, in the official order."""
    text = text.replace("\n", "")
    text = drop_blanks(text)
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。").replace(" - ", "，")
    for ch in ("（", "）", "【", "】", "`"):
        text = text.replace(ch, "")
    text = text.replace("——", " ")
    return _TRAILING_COMMAS.sub("。", text)


def spell_numbers(text: str, number_to_words: Callable[[str], str]) -> str:
    """Spell every run of ``str.isdigit`` characters with inflect, as the official code does.

    Deviation: a digit that is not a decimal digit (①, ², ⁴, ...) is spelled by its value, one word
    per character (inflect reads them all as "zero").
    """
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if not run:
            return
        decimal: list[str] = []
        words: list[str] = []
        for c in run:
            if c.isdecimal():
                decimal.append(c)
                continue
            if decimal:
                words.append(number_to_words("".join(decimal)))
                decimal.clear()
            words.append(number_to_words(str(unicodedata.digit(c))))
        if decimal:
            words.append(number_to_words("".join(decimal)))
        out.append(" ".join(words))
        run.clear()

    for c in text:
        if c.isdigit():
            run.append(c)
        else:
            flush()
            out.append(c)
    flush()
    return "".join(out)


def split_paragraph(text: str, lang: str, count_tokens: Callable[[str], int], *, max_n: int = TOKEN_MAX_N,
                    min_n: int = TOKEN_MIN_N, merge_n: int = MERGE_LEN) -> list[str]:
    """The official splitter: sentence pieces packed into segments of ``min_n``..``max_n`` units.

    Units are characters for ``lang == "zh"`` and ``count_tokens`` (the LLM's tokenizer) otherwise.
    Returns [] for an empty text (the official code raises).
    """
    if not text:
        return []
    marks = ZH_MARKS if lang == "zh" else EN_MARKS
    size: Callable[[str], int] = len if lang == "zh" else count_tokens
    if text[-1] not in marks:
        text += "。" if lang == "zh" else "."
    pieces: list[str] = []
    start = 0
    for i, c in enumerate(text):
        if c not in marks:
            continue
        if i > start:  # a mark with nothing before it is dropped
            pieces.append(text[start:i] + c)
        if i + 1 < len(text) and text[i + 1] in CLOSING_QUOTES and pieces:
            pieces[-1] += text[i + 1]  # the closing quote stays with its sentence
            start = i + 2
        else:  # (with no piece yet the official code raises; the quote then starts the next piece)
            start = i + 1
    segments: list[str] = []
    current = ""
    for piece in pieces:
        if size(current + piece) > max_n and size(current) > min_n:
            segments.append(current)
            current = ""
        current += piece
    if current:
        if size(current) < merge_n and segments:
            segments[-1] += current
        else:
            segments.append(current)
    return segments


# ---------------------------------------------------------------------------------------------
# wetext, chunked


def sentence_chunks(text: str, lang: str, *, chunk_chars: int = CHUNK_CHARS) -> list[str]:
    """``text`` cut at safe sentence ends and packed into chunks of about ``chunk_chars``.

    ``"".join(chunks) == text``. A cut is made only where no grammar reading can span it: for
    Chinese right after 。！？ when no space or quote follows; otherwise at a single space after
    ``.``/``!``/``?`` that ends a lowercase word of two or more letters (not an abbreviation such
    as "Dr." or "e.g.") and comes before a capital letter. Whether wetext gives the same output on
    the chunks as on the whole text holds on the official reference vectors.
    """
    if len(text) <= chunk_chars:
        return [text]
    cuts = _zh_cuts(text) if lang == "zh" else _en_cuts(text)
    chunks: list[str] = []
    start = 0
    last_cut = 0
    for cut in cuts:
        if cut - start > chunk_chars and last_cut > start:
            chunks.append(text[start:last_cut])
            start = last_cut
        last_cut = cut
    if len(text) - start > chunk_chars and last_cut > start:
        chunks.append(text[start:last_cut])
        start = last_cut
    chunks.append(text[start:])
    return chunks


_LOWER_ABBREVIATIONS = frozenset({"etc", "approx", "vs", "viz", "cf", "al", "ca", "esp", "incl", "resp", "no",
                                  "vol", "pp", "fig", "eq", "dept", "est", "min", "max", "sec", "hr", "hrs"})


def _en_cuts(text: str) -> list[int]:
    """Indices just after the space of each safe sentence end (see :func:`sentence_chunks`)."""
    cuts = []
    for m in re.finditer(r"(?<![A-Za-z.])([a-z]{2,})[.!?] (?=[A-Z][^\s])", text):
        if m.group(1) not in _LOWER_ABBREVIATIONS:
            cuts.append(m.end())
    return cuts


def _zh_cuts(text: str) -> list[int]:
    return [m.end() for m in re.finditer(r"[。！？](?=[^\s\"”’」』)）\]】。！？])", text)]


def unescape_wetext(text: str) -> str:
    """Undo wetext's value escaping (``\\"`` -> ``"``, ``\\\\`` -> ``\\``); exact by construction."""
    return _WETEXT_ESCAPE.sub(r"\1", text)
