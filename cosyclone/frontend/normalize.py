"""Text normalization and splitting the way the official CosyVoice3 frontend does it.

Official algorithm (FunAudioLLM/CosyVoice ace7c47, ``CosyVoiceFrontEnd.text_normalize`` with wetext
and inflect, no ttsfrd), re-implemented here from its description:

* A text holding ``<|`` and ``|>`` (markup) is neither normalized nor split: one segment, verbatim.
* Otherwise it is stripped. Chinese (any U+4E00..U+9FFF) goes through wetext (which picks its own
  grammar: Chinese when the text has CJK or is all digits), then newlines are removed, spaces not
  between two printable ASCII characters are removed, ``²``/``³`` become 平方/立方, ``.`` becomes
  ``。``, `` - `` becomes ``，``, full-width brackets and backticks go, ``——`` becomes a space, and
  trailing commas become ``。``. Everything else goes through wetext (its own language pick again)
  and then every run of ``str.isdigit`` characters is spelled by inflect.
* Splitting: a final mark is added when missing, the text is cut after each sentence mark (a mark
  with nothing before it is dropped; a closing ``"``/``”`` right after a mark joins the piece), and
  pieces are packed greedily into segments of about 60..80 units (characters for Chinese, tokens
  otherwise); a tail under 20 units joins the previous segment. Segments that are only
  punctuation/symbols (``\\p{P}``, ``\\p{S}``) are dropped.

cosyclone deviates only where that output is plainly wrong for a listener or where the official
code raises; every deviation is a row of the table in docs/text_frontend.md (pinned by a test):

* wetext 0.1.8 leaks its internal escaping: every ``"`` comes out as ``\\"`` and every ``\\`` as
  ``\\\\`` whenever its grammar ran. The escapes are removed again (exactly: ``\\X`` -> ``X``).
* ``str.isdigit`` characters that are not decimal digits (①, ², ...) are spelled by their value
  (official inflect reads them all as "zero").
* wetext's English grammar finds no reading for a Windows line end ("a\\r\\nb") and the official code
  raises; such a text is normalized again with each ``\\r\\n`` made ``\\n``, which gives the official
  output of the same text saved with LF line ends (what Python's text mode hands the official code
  when it reads a Windows file). A lone ``\\r``, tab, vertical tab and form feed need nothing: wetext
  and the official steps read them, and what they leave goes to the tokenizer as officially (Chinese
  text keeps the ``\\r`` of a ``\\r\\n``, since only ``\\n`` is removed there).
* wetext's English grammar finds no reading for some runs of whitespace ("a  b", "x\\n\\ny") and the
  official code raises; such a text is normalized again with each whitespace run made one space.
* A closing quote right after a mark with no sentence before it (the official splitter raises)
  starts the next piece instead.

Normalizers (wetext grammars, the inflect engine) are built once per process
(:func:`get_normalizer`); a missing or failing normalizer is an error there, never a silent fallback.
Normalized texts are memoized, and found in the content cache of :mod:`cosyclone.text_cache` that
manifest validation fills (``store``), so the frontend's later pass is a lookup, and long texts are normalized sentence by sentence (identical output on the reference
vectors, several times faster: wetext slows down on long inputs).
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import regex

from cosyclone.errors import CosycloneError

TEXT_FRONTENDS = ("wetext", "none")  # wetext: the official normalizer; none: the official code without one
WETEXT_VERSION = "0.1.8"  # the version the reference vectors were made with (pinned in pyproject)
INFLECT_VERSION = "7.6.0"

ZH_MARKS = frozenset("。？！；：、.?!;")  # sentence marks of the Chinese splitter
EN_MARKS = frozenset(".?!;:")  # sentence marks of the other splitter
CLOSING_QUOTES = frozenset('"”')  # a quote right after a mark belongs to that piece
TOKEN_MAX_N, TOKEN_MIN_N, MERGE_LEN = 80, 60, 20  # the official splitter's packing bounds

_CHINESE = re.compile(r"[\u4e00-\u9fff]")
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
    the chunks as on the whole text is checked on the reference vectors (tests/parity).
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


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Normalized:
    """A text after normalization, before splitting."""

    text: str  # what the splitter receives
    lang: str  # "zh" (Chinese rules, character lengths) or "en" (token lengths)


class TextNormalizer:
    """The official normalization with one text frontend (``wetext`` or ``none``).

    Build it with :func:`get_normalizer` (once per process and kind). Raises :class:`TextError`
    when the required packages are missing or do not work.
    """

    def __init__(self, kind: str = "wetext", *, memo_chars: int = 32_000_000) -> None:
        if kind not in TEXT_FRONTENDS:
            raise TextError(f"--text-frontend must be one of {', '.join(TEXT_FRONTENDS)}, not {kind!r}")
        self.kind = kind
        try:
            import inflect
        except Exception as exc:  # ImportError, or a broken dependency of it
            raise TextError(f"the text frontend needs inflect=={INFLECT_VERSION} (pip install -e .): {exc}") from exc
        self._inflect = inflect.engine()
        self._wetext: Any = None
        self._wetext_utils: Any = None
        if kind == "wetext":
            try:
                import wetext
                import wetext.utils
            except Exception as exc:
                raise TextError(f"--text-frontend wetext needs wetext=={WETEXT_VERSION} (pip install -e .), or "
                                f"pass --text-frontend none: {exc}") from exc
            self._wetext = wetext.Normalizer(remove_erhua=False)  # the official settings
            self._wetext_utils = wetext.utils
        self._memo: OrderedDict[str, Normalized] = OrderedDict()
        self._memo_chars = 0
        self._memo_limit = memo_chars
        self._lock = threading.Lock()
        #: Results made ahead for the manifest chunk being validated (text -> (normalized, lang)); see
        #: cosyclone.manifest_stream. Not copied into the memo: it is replaced chunk by chunk.
        self.overlay: dict[str, tuple[str, str]] = {}
        #: The content cache of cosyclone.text_cache (``get_many``), asked on a memo miss before computing.
        self.store: Any = None
        self._self_check()

    def _self_check(self) -> None:
        """Fail at load, not on row 10,000, when a normalizer does not read numbers."""
        probes = {"en": ("I have 2 cats.", "two")}
        if self.kind == "wetext":
            probes["zh"] = ("我有2只猫。", "两")
        for lang, (probe, word) in probes.items():
            try:
                got = self._normalize(probe).text
            except Exception as exc:
                raise TextError(f"text frontend {self.kind!r} failed its self-check on {probe!r}: {exc}") from exc
            if word not in got:
                raise TextError(f"text frontend {self.kind!r} does not spell numbers ({lang}): {probe!r} -> {got!r}")

    def version(self) -> dict[str, str]:
        """Versions of the packages in use (recorded with a run)."""
        from importlib.metadata import version

        out = {"text_frontend": self.kind, "inflect": version("inflect")}
        if self.kind == "wetext":
            out["wetext"] = version("wetext")
        return out

    # -- phase 1: normalization (memoized) ---------------------------------------------------

    def normalize(self, text: str) -> Normalized:
        """``text`` (not markup, not blank) normalized as the official frontend does before splitting."""
        ready = self.overlay.get(text)
        if ready is not None:
            return Normalized(*ready)
        with self._lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return hit
        stored = self.store.get_many([text]).get(text) if self.store is not None else None
        out = Normalized(*stored) if stored is not None else self._normalize(text)
        self._remember(text, out)
        return out

    def remember(self, results: dict[str, tuple[str, str]]) -> None:
        """Put texts normalized elsewhere (a worker process) into the memo, as if normalized here."""
        for text, (norm, lang) in results.items():
            self._remember(text, Normalized(norm, lang))

    def _remember(self, text: str, out: Normalized) -> None:
        with self._lock:
            if text not in self._memo and len(text) <= self._memo_limit:
                self._memo[text] = out
                self._memo_chars += len(text)
                while self._memo_chars > self._memo_limit:
                    old, _ = self._memo.popitem(last=False)
                    self._memo_chars -= len(old)

    def _normalize(self, text: str) -> Normalized:
        text = text.strip()
        if contains_chinese(text):
            return Normalized(chinese_rules(self._tn(text)), "zh")
        return Normalized(spell_numbers(self._tn(text), self._inflect.number_to_words), "en")

    def _tn(self, text: str) -> str:
        """wetext over ``text`` (its own language pick), sentence by sentence; identity for ``none``."""
        if self._wetext is None or not text:
            return text
        utils = self._wetext_utils
        lang = utils.get_lang(text)
        chunks = sentence_chunks(text, lang)
        if len(chunks) == 1:
            return self._tn_one(text, "auto")
        return "".join(self._tn_chunk(c, lang) for c in chunks)

    def _tn_chunk(self, chunk: str, lang: str) -> str:
        """One chunk through wetext with the whole text's language; keeps the chunk's outer spaces."""
        core = chunk.strip()
        if not core:
            return chunk
        lead = chunk[: len(chunk) - len(chunk.lstrip())]
        trail = chunk[len(chunk.rstrip()):]
        return lead + self._tn_one(core, lang) + trail

    def _tn_one(self, text: str, lang: str) -> str:
        """wetext over one stripped piece; where it has no reading, do better than raising.

        The official code raises when wetext finds no path (e.g. "a\\r\\nb", "two  spaces",
        "x\\n\\ny", "item #3"). Then: the text with its Windows line ends made ``\\n`` (the official
        reading of the same text with LF line ends); if that fails too, the text with each whitespace
        run made one space; if that fails too, the words wetext cannot read alone are left as written
        (inflect still spells their digits) and the runs of words between them are normalized whole.
        """
        pick = self._wetext_utils.get_lang(text.strip()) if lang == "auto" else lang
        out = self._try_tn(text, pick)
        if out is not None:
            return out
        if "\r\n" in text:
            out = self._try_tn(text.replace("\r\n", "\n"), pick)
            if out is not None:
                return out
        collapsed = _WHITESPACE_RUN.sub(" ", text).strip()
        if collapsed != text:
            out = self._try_tn(collapsed, pick)
            if out is not None:
                return out
        words = collapsed.split(" ")
        readable = [len(words) > 1 and self._try_tn(w, pick) is not None for w in words]
        parts: list[str] = []
        run: list[str] = []
        for word, ok in zip(words, readable, strict=True):
            if ok:
                run.append(word)
                continue
            if run:
                parts.append(self._tn_span(run, pick))
                run = []
            parts.append(word)
        if run:
            parts.append(self._tn_span(run, pick))
        return " ".join(parts)

    def _tn_span(self, words: list[str], lang: str) -> str:
        """Words that wetext reads one by one: whole if it reads them together, else in halves."""
        out = self._try_tn(" ".join(words), lang)
        if out is not None:
            return out
        if len(words) == 1:  # unreachable for a word read alone; kept so the recursion always ends
            return words[0]
        mid = len(words) // 2
        return self._tn_span(words[:mid], lang) + " " + self._tn_span(words[mid:], lang)

    def _try_tn(self, text: str, lang: str) -> str | None:
        """wetext's output for ``text`` with its escaping undone, or None when it has no reading."""
        try:
            out = self._wetext.normalize(text, lang=lang)
        except Exception:  # no path through the grammar: AssertionError / RuntimeError / IndexError
            return None
        if self._wetext_utils.should_normalize(text.strip(), lang, "tn", False):
            out = unescape_wetext(out)
        return out

    # -- phase 2: splitting ------------------------------------------------------------------

    def segments(self, text: str, count_tokens: Callable[[str], int]) -> list[str]:
        """The official ``text_normalize(text, split=True)``: segments, punctuation-only ones dropped.

        A markup text comes back verbatim as one segment; a blank one gives [].
        """
        if has_markup(text):
            return [text]
        if not text.strip():
            return []
        norm = self.normalize(text)
        pieces = split_paragraph(norm.text, norm.lang, count_tokens)
        return [p for p in pieces if not is_only_punctuation(p)]

    def speakable(self, text: str) -> bool:
        """Whether ``text`` leaves something to say after normalization (no tokenizer needed).

        Splitting only cuts and packs, so a segment with speech exists exactly when the normalized
        text has a letter, mark or number.
        """
        if not text.strip():
            return False
        if has_markup(text):
            return has_speech(text)
        return has_speech(self.normalize(text).text)


_NORMALIZERS: dict[str, TextNormalizer] = {}
_NORMALIZERS_LOCK = threading.Lock()


def get_normalizer(kind: str = "wetext") -> TextNormalizer:
    """The process-wide :class:`TextNormalizer` of ``kind`` (built on first use)."""
    with _NORMALIZERS_LOCK:
        found = _NORMALIZERS.get(kind)
        if found is None:
            found = _NORMALIZERS[kind] = TextNormalizer(kind)
        return found
