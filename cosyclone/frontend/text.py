"""Text side of the frontend: CosyVoice3 tokenizer, prompt formats, normalization and splitting.

The LLM refuses input without ``<|endofprompt|>`` (id 151646) — pitfall 7 — so every mode's
prompt is checked here; a missing system prefix is added (never sent silently broken).
Normalization follows spec 1.4 without external tools (wetext/inflect are used when installed).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from pathlib import Path

from cosyclone.config import ENDOFPROMPT, SYSTEM_PREFIX
from cosyclone.errors import CosycloneError

ENDOFPROMPT_ID = 151646
MODES = ("zero_shot", "cross_lingual", "instruct2")
INSTRUCT_PREFIX = "You are a helpful assistant. "

def _words(s: str) -> list[str]:
    return s.split()


_NAMED = ["<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]", "[cough]",
          "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
          "[vocalized-noise]", "[lipsmack]", "[mn]", "<|endofsystem|>"]
_CMU = _words("AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 "
        "B CH D DH EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N "
        "NG OW OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH")
_PINYIN = _words("a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng "
           "iáo iè ié iòng ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p "
           "q r s sh t u uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī "
           "uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì "
           "ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng "
           "ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ")
SPECIAL_TOKENS: list[str] = ["<|im_start|>", "<|im_end|>", *_NAMED, *[f"[{p}]" for p in _CMU + _PINYIN]]
assert len(_CMU) == 84 and len(_PINYIN) == 176 and len(SPECIAL_TOKENS) == 280


class TextError(CosycloneError):
    """Text input cannot be turned into a valid CosyVoice3 prompt."""


# ---------------------------------------------------------------------------------------------
# Numbers → English words (inflect style: "one hundred and twenty-three")

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ["", "thousand", "million", "billion", "trillion", "quadrillion"]


def _under_1000(n: int) -> str:
    """0 < n < 1000 in words."""
    parts = []
    if n >= 100:
        parts.append(f"{_ONES[n // 100]} hundred")
        n %= 100
        if n:
            parts.append("and")
    if n >= 20:
        parts.append(_TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else ""))
    elif n:
        parts.append(_ONES[n])
    return " ".join(parts)


def number_to_words(digits: str) -> str:
    """A digit string → English words; over 18 digits it is read digit by digit."""
    n = int(digits)
    if n == 0:
        return "zero"
    if len(digits.lstrip("0")) > 18:
        return " ".join(_ONES[int(d)] for d in digits)
    groups = []
    scale = 0
    while n:
        n, rem = divmod(n, 1000)
        if rem:
            groups.append((scale, rem))
        scale += 1
    words = []
    for i, (sc, rem) in enumerate(reversed(groups)):
        w = _under_1000(rem)
        if i == len(groups) - 1 and sc == 0 and rem < 100 and len(groups) > 1:
            w = "and " + w
        words.append(w + (f" {_SCALES[sc]}" if sc else ""))
    return ", ".join(words).replace(", and ", " and ")


def _spell_numbers(text: str) -> str:
    try:
        import inflect  # optional, the upstream choice
        eng = inflect.engine()

        def conv(m: re.Match[str]) -> str:
            return str(eng.number_to_words(m.group()))
    except ImportError:
        def conv(m: re.Match[str]) -> str:
            return number_to_words(m.group())
    return re.sub(r"\d+", conv, text)


# ---------------------------------------------------------------------------------------------
# Normalization and splitting (spec 1.4)

_ZH_MARKS = "。？！；：、.?!;"
_EN_MARKS = ".?!;:"


def _is_only_punct(s: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in s)


def _contains_zh(text: str) -> bool:
    return any("\u4e00" <= c <= "\u9fff" for c in text)


def split_paragraph(text: str, length: Callable[[str], int], lang: str, token_max_n: int = 80,
                    token_min_n: int = 60, merge_len: int = 20) -> list[str]:
    """Cut after sentence marks, then greedily pack pieces into segments of ~60..80 units."""
    marks = _ZH_MARKS if lang == "zh" else _EN_MARKS
    if text and text[-1] not in marks:
        text += "。" if lang == "zh" else "."
    pieces: list[str] = []
    start = 0
    i = 0
    while i < len(text):
        if text[i] in marks:
            end = i + 1
            if end < len(text) and text[end] in "\"”":
                end += 1
            pieces.append(text[start:end])
            start = i = end
            continue
        i += 1
    if start < len(text):
        pieces.append(text[start:])
    out: list[str] = []
    cur = ""
    for piece in pieces:
        if length(cur + piece) > token_max_n and length(cur) > token_min_n:
            out.append(cur)
            cur = ""
        cur += piece
    if cur:
        if length(cur) < merge_len and out:
            out[-1] += cur
        else:
            out.append(cur)
    return out


def _zh_rules(text: str) -> str:
    text = text.replace("\n", "")
    text = re.sub(r"(?<=[^\x21-\x7e]) | (?=[^\x21-\x7e])|^ | $", "", text)
    text = re.sub(r"(?<![\x21-\x7e]) (?![\x21-\x7e])", "", text)
    text = text.replace("²", "平方").replace("³", "立方").replace(".", "。").replace(" - ", "，")
    text = re.sub(r"[（）【】`]", "", text).replace("——", " ")
    return re.sub(r"[，,、]+$", "。", text)


# ---------------------------------------------------------------------------------------------


class TextFrontend:
    """Qwen2 tokenizer + CosyVoice3's added tokens, prompt assembly and text normalization."""

    def __init__(self, qwen_dir: str | Path, *, text_frontend: bool = True) -> None:
        from transformers import AutoTokenizer

        self.qwen_dir = Path(qwen_dir)
        try:
            tok = AutoTokenizer.from_pretrained(str(self.qwen_dir))
        except Exception as exc:  # transformers raises OSError/ValueError variants
            raise CosycloneError(f"cannot load the Qwen tokenizer from {self.qwen_dir}: {exc}") from exc
        tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                                "additional_special_tokens": SPECIAL_TOKENS})
        got = tok.convert_tokens_to_ids(ENDOFPROMPT)
        if got != ENDOFPROMPT_ID:
            raise CosycloneError(f"tokenizer in {self.qwen_dir}: {ENDOFPROMPT} got id {got}, expected "
                                 f"{ENDOFPROMPT_ID} — this is not the CosyVoice-BlankEN tokenizer")
        self.tokenizer = tok
        self.text_frontend = text_frontend

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS; added tokens matched atomically)."""
        return [int(i) for i in self.tokenizer([text])["input_ids"][0]]

    def normalize(self, text: str, split: bool = True) -> list[str]:
        """Spec 1.4: text → segments (or a one-element list when ``split`` is False)."""
        if not self.text_frontend or not text or ("<|" in text and "|>" in text):
            return [text]
        text = text.strip()
        try:
            from wetext import Normalizer  # optional
            text = Normalizer(lang="zh" if _contains_zh(text) else "en").normalize(text)
        except Exception:  # not installed, or its API differs: the built-in rules below suffice
            pass
        if _contains_zh(text):
            text = _zh_rules(text)
            segs = split_paragraph(text, len, "zh") if split else [text]
        else:
            text = _spell_numbers(text)
            segs = split_paragraph(text, lambda s: len(self.encode(s)), "en") if split else [text]
        segs = [s for s in segs if not _is_only_punct(s)]
        return segs if split else segs[:1] or [text]

    def build_text(self, mode: str, prompt_text: str | None, text: str, instruct: str | None = None,
                   *, row_id: str | None = None) -> tuple[list[int], list[list[int]]]:
        """(prompt ids, per-segment target ids) for a mode; 151646 is guaranteed to occur.

        zero_shot: SYSTEM_PREFIX + transcript, tokenized apart from each target segment.
        cross_lingual: no prompt text; the prefix goes in front of the target (one segment).
        instruct2: "You are a helpful assistant. <instruction><|endofprompt|>" as prompt text.
        """
        where = f"row {row_id!r}: " if row_id is not None else ""
        if mode not in MODES:
            raise TextError(f"{where}unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        if not text or not text.strip():
            raise TextError(f"{where}empty target text")
        if mode == "zero_shot":
            if not prompt_text:
                raise TextError(f"{where}zero_shot needs the prompt transcript (prompt_text)")
            if ENDOFPROMPT not in prompt_text:
                prompt_text = SYSTEM_PREFIX + prompt_text
            prompt = self.normalize(prompt_text, split=False)[0]
            segments = self.normalize(text)
        elif mode == "cross_lingual":
            if ENDOFPROMPT not in text:
                text = SYSTEM_PREFIX + text
            prompt = ""
            segments = self.normalize(text)
        else:
            if not instruct:
                raise TextError(f"{where}instruct2 needs an instruction (instruct)")
            prompt = instruct if ENDOFPROMPT in instruct else f"{INSTRUCT_PREFIX}{instruct}{ENDOFPROMPT}"
            segments = self.normalize(text)
        if ENDOFPROMPT in text and mode != "cross_lingual":
            raise TextError(f"{where}target text must not contain {ENDOFPROMPT} in {mode} mode")
        prompt_ids = self.encode(prompt) if prompt else []
        seg_ids = [self.encode(s) for s in segments]
        seg_ids = [s for s in seg_ids if s]
        if not seg_ids:
            raise TextError(f"{where}target text has nothing to speak after normalization")
        for ids in seg_ids:
            if ENDOFPROMPT_ID not in prompt_ids and ENDOFPROMPT_ID not in ids:
                raise TextError(f"{where}{ENDOFPROMPT} (id {ENDOFPROMPT_ID}) missing from the LLM input")
        return prompt_ids, seg_ids
