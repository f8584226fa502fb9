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
code raises; every deviation is a row of the table in docs/text_frontend.md:

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

Normalizers (wetext grammars, the inflect engine) are built once per process (:func:`get_normalizer`); a
missing or failing normalizer is an error there, never a silent fallback. Normalized texts are memoized, and
found in the content cache of :mod:`cosyclone.manifest.text_cache` that manifest validation fills (``store``),
so the frontend's later pass is a lookup, and long texts are normalized sentence by sentence (identical output
on the reference
vectors, several times faster: wetext slows down on long inputs).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from cosyclone.frontend.text_rules import (
    _WHITESPACE_RUN,
    TextError,
    chinese_rules,
    contains_chinese,
    evidently_speakable,
    has_markup,
    has_speech,
    is_only_punctuation,
    sentence_chunks,
    spell_numbers,
    split_paragraph,
    unescape_wetext,
)
from cosyclone.options import TEXT_FRONTENDS, TextFrontendName

WETEXT_VERSION = "0.1.8"  # the version the reference vectors were made with (pinned in pyproject)
INFLECT_VERSION = "7.6.0"


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

    def __init__(self, kind: TextFrontendName = "wetext", *, memo_chars: int = 32_000_000) -> None:
        if kind not in TEXT_FRONTENDS:
            raise TextError(f"--text-frontend must be one of {', '.join(TEXT_FRONTENDS)}, not {kind!r}")
        self.kind = kind
        try:
            import inflect
        except Exception as exc:  # ImportError, or a broken dependency of it
            raise TextError(
                f"the text frontend needs inflect=={INFLECT_VERSION} (pip install -e .): {exc}"
            ) from exc
        self._inflect = inflect.engine()
        self._wetext: Any = None
        self._wetext_utils: Any = None
        if kind == "wetext":
            try:
                import wetext
                import wetext.utils
            except Exception as exc:
                raise TextError(
                    f"--text-frontend wetext needs wetext=={WETEXT_VERSION} (pip install -e .), or "
                    f"pass --text-frontend none: {exc}"
                ) from exc
            self._wetext = wetext.Normalizer(remove_erhua=False)  # the official settings
            self._wetext_utils = wetext.utils
        self._memo: OrderedDict[str, Normalized] = OrderedDict()
        self._memo_chars = 0
        self._memo_limit = memo_chars
        self._lock = threading.Lock()
        #: Results made ahead for the manifest chunk being validated (text -> (normalized, lang)); see
        #: cosyclone.manifest.stream. Not copied into the memo: it is replaced chunk by chunk.
        self.overlay: dict[str, tuple[str, str]] = {}
        # : The content cache of cosyclone.manifest.text_cache (``get_many``), asked on a memo miss before
        # computing.
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
                raise TextError(
                    f"text frontend {self.kind!r} failed its self-check on {probe!r}: {exc}"
                ) from exc
            if word not in got:
                raise TextError(
                    f"text frontend {self.kind!r} does not spell numbers ({lang}): {probe!r} -> {got!r}"
                )

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
        return Normalized(spell_numbers(self._tn(text), self._number_to_words), "en")

    def _number_to_words(self, digits: str) -> str:
        """inflect's spelling of one run of digits (always one string: the official call's form)."""
        return str(self._inflect.number_to_words(digits))

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
        return cast("str | None", out)

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
        text has a letter, mark or number. A text that evidently keeps one
        (:func:`~cosyclone.frontend.text_rules.evidently_speakable`: an ASCII letter or digit, a CJK
        ideograph) is answered without normalizing it: a dry run of ordinary texts pays no wetext.
        """
        if not text.strip():
            return False
        if has_markup(text):
            return has_speech(text)
        if evidently_speakable(text):
            return True
        return has_speech(self.normalize(text).text)


_NORMALIZERS: dict[str, TextNormalizer] = {}
_NORMALIZERS_LOCK = threading.Lock()


def get_normalizer(kind: TextFrontendName = "wetext") -> TextNormalizer:
    """The process-wide :class:`TextNormalizer` of ``kind`` (built on first use)."""
    with _NORMALIZERS_LOCK:
        found = _NORMALIZERS.get(kind)
        if found is None:
            found = _NORMALIZERS[kind] = TextNormalizer(kind)
        return found
