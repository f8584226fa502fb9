"""Text metrics of one row: language, normalization, WER / CER (jiwer) and the transcript similarity ratio.

Both sides (the manifest's ``text`` and the ASR transcript) go through the same normalization,
so the figures measure what was said, not how it was written (docs/eval.md spells out every step):

* markup the synthesizer reads but does not say is dropped: ``<|en|>``-style tags, ``[breath]``-
  style tags, ``<strong>``; Unicode NFKC; curly apostrophes become ``'``;
* English (and any language written with spaces): case folded; numbers spelled out with inflect
  (English only: ``12`` -> ``twelve``, ``1,234`` -> ``one thousand two hundred thirty-four``,
  ``3.5`` -> ``three point five``, ``21st`` -> ``twenty-first``, ``%`` -> ``percent``); then every
  punctuation or symbol character becomes a space (an apostrophe inside a word stays) and runs of
  spaces collapse. The primary error rate is the WER on words;
* Chinese / Japanese (and Cantonese): punctuation, symbols and all whitespace removed; the primary
  error rate is the CER on characters (there is no WER: the text has no word boundaries).

The similarity ratio is :class:`difflib.SequenceMatcher`'s ratio of the normalized transcript to
the normalized text (1.0 = identical after normalization), the figure the field's Whisper-based
quality checks assert.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cosyclone.eval.deps import require

CER_LANGUAGES = frozenset({"zh", "ja", "yue"})  # scored on characters, not words
_TAG_LANG = {"jp": "ja", "cn": "zh"}  # CosyVoice tag spellings -> ISO 639-1 (as Whisper names them)
_LANG_TAG = re.compile(r"^\s*<\|([a-z]{2,3})\|>")
_MARKUP = re.compile(r"<\|[^|<>]*\|>|\[[A-Za-z0-9_\-]+\]|</?strong>")
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_HANGUL = re.compile(r"[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_GROUPED = re.compile(r"\b\d{1,3}(?:,\d{3})+\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


def infer_language(text: str) -> tuple[str | None, str]:
    """(language of ``text`` or None when the text alone cannot tell, how it was found).

    A leading CosyVoice language tag (``<|zh|>``, ``<|en|>``, ``<|jp|>`` ...) wins ("tag"); any kana
    means Japanese, any Han character (without kana) Chinese, Hangul Korean ("text"). Latin-script
    text is left to the ASR model to detect (an English-only model implies English).
    """
    m = _LANG_TAG.match(text)
    if m:
        code = m.group(1)
        return _TAG_LANG.get(code, code), "tag"
    if _KANA.search(text):
        return "ja", "text"
    if _HAN.search(text):
        return "zh", "text"
    if _HANGUL.search(text):
        return "ko", "text"
    return None, "unknown"


@lru_cache(maxsize=1)
def _inflect_engine() -> Any:  # one engine per process: building it parses inflect's tables
    return require("inflect", purpose="spelling numbers for the English WER").engine()


def spell_numbers(text: str) -> str:
    """English digits -> words (ordinals, thousands separators, decimals, percent), via inflect."""
    if not any(ch.isdigit() for ch in text):
        return text.replace("%", " percent")
    p = _inflect_engine()

    def words(number: str) -> str:
        return " " + str(p.number_to_words(number, andword="")) + " "

    text = _ORDINAL.sub(lambda m: " " + str(p.number_to_words(p.ordinal(m.group(1)))) + " ", text)
    text = _GROUPED.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _NUMBER.sub(lambda m: words(m.group(0)), text)
    return text.replace("%", " percent")


def _strip_punctuation(text: str, *, keep_spaces: bool) -> str:
    out = []
    n = len(text)
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        if ch == "'" and keep_spaces and 0 < i < n - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.append(ch)  # don't, Sam's: the apostrophe is part of the word on both sides
        elif cat[0] in "PS" or ch.isspace():
            out.append(" " if keep_spaces else "")
        else:
            out.append(ch)
    joined = "".join(out)
    return " ".join(joined.split()) if keep_spaces else joined


def normalize(text: str, language: str | None) -> str:
    """``text`` as it is compared (see the module docstring); ``language`` None is treated as English."""
    text = _MARKUP.sub(" ", text)
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES)
    if language in CER_LANGUAGES:
        return _strip_punctuation(text, keep_spaces=False).casefold()
    if language in (None, "en"):
        text = spell_numbers(text)
    return _strip_punctuation(text.casefold(), keep_spaces=True)


@dataclass(frozen=True)
class TextScore:
    """How well one transcript matches its text (rates are fractions: 0.05 = 5 %)."""

    language: str | None  # language the row was scored in (None: unknown, scored as English)
    metric: str  # "wer" or "cer": which rate is ``error_rate``
    reference: str  # normalized text
    hypothesis: str  # normalized transcript
    wer: float | None  # word error rate (None for character-scored languages or an empty reference)
    cer: float | None  # character error rate (spaces count as characters where the language has them)
    error_rate: float | None  # the primary rate: WER, or CER for zh/ja/yue (what --max-wer compares)
    similarity_ratio: float | None  # difflib ratio of hypothesis to reference in [0, 1]
    ref_words: int  # words in the normalized reference (pooled WER denominator)
    word_edits: int  # substitutions + deletions + insertions on words
    ref_chars: int  # characters in the normalized reference (pooled CER denominator)
    char_edits: int  # substitutions + deletions + insertions on characters


def score(text: str, transcript: str, language: str | None) -> TextScore:
    """Normalize both sides and compute WER, CER (jiwer) and the similarity ratio."""
    jiwer = require("jiwer", purpose="WER/CER")
    ref, hyp = normalize(text, language), normalize(transcript, language)
    metric = "cer" if language in CER_LANGUAGES else "wer"
    if not ref:  # nothing speakable in the text: no rate is defined
        return TextScore(language, metric, ref, hyp, None, None, None, None, 0, 0, 0, 0)
    chars = jiwer.process_characters(ref, hyp)
    char_edits = chars.substitutions + chars.deletions + chars.insertions
    ref_chars = chars.substitutions + chars.deletions + chars.hits
    cer = char_edits / max(1, ref_chars)
    wer, ref_words, word_edits = None, 0, 0
    if metric == "wer":
        words = jiwer.process_words(ref, hyp)
        word_edits = words.substitutions + words.deletions + words.insertions
        ref_words = words.substitutions + words.deletions + words.hits
        wer = word_edits / max(1, ref_words)
    ratio = difflib.SequenceMatcher(None, hyp, ref, autojunk=False).ratio()
    return TextScore(language, metric, ref, hyp, wer, cer, wer if metric == "wer" else cer, ratio,
                     ref_words, word_edits, ref_chars, char_edits)
