"""Text side of the frontend: the CosyVoice3 tokenizer and what the LLM reads in each mode.

One rule for every mode (docs/text_frontend.md): a row written as the official README writes it
gets the official ids, and a row that leaves the system prefix out gets the ids of the same row
with it. zero_shot: ``You are a helpful assistant.<|endofprompt|>`` + transcript is the prompt
(verbatim: the markup switches normalization off, as officially). cross_lingual: the prefix goes in
front of the target text, verbatim; a text the official splitter cuts into several segments is
normalized and split like any other, with the prefix in front of every segment. instruct2:
``You are a helpful assistant. <instruction><|endofprompt|>`` is the prompt. The target text is
normalized and split by :mod:`cosyclone.frontend.normalize`. The LLM refuses input without
``<|endofprompt|>`` (id 151646), so every plan is checked for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosyclone.errors import CosycloneError
from cosyclone.frontend import prompt_cache
from cosyclone.frontend.normalize import get_normalizer
from cosyclone.frontend.prompt_cache import LRUCache
from cosyclone.frontend.text_rules import TextError, has_speech
from cosyclone.model.config import ENDOFPROMPT, SYSTEM_PREFIX
from cosyclone.options import MODES, Mode, TextFrontendName

ENDOFPROMPT_ID = 151646
INSTRUCT_SYSTEM = "You are a helpful assistant."  # what the official README's instructions start with
INSTRUCT_PREFIX = INSTRUCT_SYSTEM + " "


def _words(s: str) -> list[str]:
    return s.split()


_NAMED = ["<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]", "[cough]",
          "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
          "[vocalized-noise]", "[lipsmack]", "[mn]", "<|endofsystem|>"]
_CMU = _words(
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 "
    "B CH D DH EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N "
    "NG OW OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
)
_PINYIN = _words(
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng "
    "iáo iè ié iòng ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p "
    "q r s sh t u uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī "
    "uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì "
    "ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng "
    "ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
)
SPECIAL_TOKENS: list[str] = ["<|im_start|>", "<|im_end|>", *_NAMED, *[f"[{p}]" for p in _CMU + _PINYIN]]
assert len(_CMU) == 84 and len(_PINYIN) == 176 and len(SPECIAL_TOKENS) == 280


__all__ = ["ENDOFPROMPT_ID", "MODES", "SPECIAL_TOKENS", "Segment", "TextError", "TextFrontend", "TextPlan",
           "instruct_prompt", "target_parts", "text_problem", "zero_shot_prompt"]


# ---------------------------------------------------------------------------------------------
# The prompt of each mode (tokenizer-free, shared with manifest validation)


def zero_shot_prompt(prompt_text: str) -> str:
    """The zero_shot prompt text: the transcript behind the system prefix (kept when already there)."""
    return prompt_text if ENDOFPROMPT in prompt_text else SYSTEM_PREFIX + prompt_text


def instruct_prompt(instruct: str) -> str:
    """The instruct2 prompt: ``You are a helpful assistant. <instruction><|endofprompt|>``.

    An instruction that already holds ``<|endofprompt|>`` is used as written; one that starts with
    the system sentence only gets the closing ``<|endofprompt|>``.
    """
    if ENDOFPROMPT in instruct:
        return instruct
    if instruct.startswith(INSTRUCT_SYSTEM):
        return instruct + ENDOFPROMPT
    return INSTRUCT_PREFIX + instruct + ENDOFPROMPT


def target_parts(mode: Mode, text: str) -> tuple[str, str]:
    """(system part, text to speak) of a row's target text; raises :class:`TextError` when misplaced.

    cross_lingual: everything up to the first ``<|endofprompt|>`` is the system part (the prefix
    when the row leaves it out). Other modes: no system part; ``<|endofprompt|>`` in the target
    would make the LLM read a second system prompt, so it is refused.
    """
    if mode == "cross_lingual":
        cut = text.find(ENDOFPROMPT)
        head, body = (
            (SYSTEM_PREFIX, text)
            if cut < 0
            else (text[: cut + len(ENDOFPROMPT)], text[cut + len(ENDOFPROMPT) :])
        )
        if ENDOFPROMPT in body:
            raise TextError(f"text holds {ENDOFPROMPT} more than once")
        return head, body
    if ENDOFPROMPT in text:
        where = "prompt_text" if mode == "zero_shot" else "instruct"
        raise TextError(
            f"text must not contain {ENDOFPROMPT} in {mode} (the system prompt belongs in {where})"
        )
    return "", text


def text_problem(mode: Mode, text: str, *, text_frontend: TextFrontendName = "wetext") -> str | None:
    """Why ``text`` cannot be spoken in ``mode`` (None when it can); no tokenizer needed."""
    if not text.strip():
        return "text is empty or only whitespace"
    try:
        _, body = target_parts(mode, text)
    except TextError as exc:
        return str(exc)
    if not body.strip():
        return "text has nothing after the system prefix"
    if not get_normalizer(text_frontend).speakable(body):
        return "text has nothing to speak (only punctuation, symbols or emoji)"
    return None


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One target segment: the text the LLM reads after the prompt, and its ids."""

    text: str  # normalized segment (cross_lingual: with the system part in front)
    ids: tuple[int, ...]  # its token ids


@dataclass(frozen=True)
class TextPlan:
    """What the LLM reads for one row: ``prompt_ids + segment.ids`` for each segment."""

    mode: Mode  # how the prompt conditions the model
    prompt_text: str  # the prompt text as tokenized ("" for cross_lingual)
    prompt_ids: tuple[int, ...]  # its ids (() for cross_lingual)
    segments: tuple[Segment, ...]  # at least one

    def positions(self, index: int, *, prompt_speech_tokens: int, max_len_ratio: float) -> int:
        """LLM positions segment ``index`` can need: sos, text, task id, prompt speech, longest decode."""
        n = len(self.segments[index].ids)
        return 2 + len(self.prompt_ids) + n + prompt_speech_tokens + max(1, int(max_len_ratio * n))

    def check_fit(self, *, max_positions: int, max_len_ratio: float, prompt_speech_tokens: int = 0,
                  row_id: str | None = None) -> None:
        """Raise :class:`TextError` when a segment cannot fit the LLM's ``max_positions``."""
        where = f"row {row_id!r}: " if row_id is not None else ""
        for i in range(len(self.segments)):
            need = self.positions(i, prompt_speech_tokens=prompt_speech_tokens, max_len_ratio=max_len_ratio)
            if need > max_positions:
                raise TextError(
                    f"{where}segment {i + 1} of {len(self.segments)} has {len(self.segments[i].ids)} "
                    f"text tokens and can need {need} positions "
                    f"(with {len(self.prompt_ids)} prompt tokens and "
                    f"{prompt_speech_tokens} prompt speech tokens); the model has {max_positions}. "
                    f"Add sentence punctuation so the text can be split, or shorten it"
                )


class TextFrontend:
    """Qwen2 tokenizer + CosyVoice3's added tokens, and the per-mode plan of what the LLM reads."""

    def __init__(self, qwen_dir: str | Path, *, text_frontend: TextFrontendName = "wetext",
                 prompt_cache_entries: int = prompt_cache.DEFAULT_ENTRIES) -> None:
        from transformers import AutoTokenizer

        # a prompt transcript (or instruction) shared by many rows is tokenized once
        self.prompt_ids_cache: LRUCache[tuple[int, ...]] = LRUCache(prompt_cache_entries)

        self.normalizer = get_normalizer(text_frontend)  # first: a missing normalizer fails at load
        self.text_frontend = text_frontend
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

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS; added tokens matched atomically)."""
        return [int(i) for i in self.tokenizer([text])["input_ids"][0]]

    def count_tokens(self, text: str) -> int:
        """Number of ids of ``text`` (the splitter's length for non-Chinese text)."""
        return len(self.tokenizer([text])["input_ids"][0])

    def segments(self, text: str) -> list[str]:
        """The official ``text_normalize(text, split=True)`` with this tokenizer's lengths."""
        return self.normalizer.segments(text, self.count_tokens)

    def plan(self, mode: Mode, prompt_text: str | None, text: str, instruct: str | None = None, *,
             row_id: str | None = None) -> TextPlan:
        """The row's :class:`TextPlan`; raises :class:`TextError` naming the row when it cannot be spoken."""
        where = f"row {row_id!r}: " if row_id is not None else ""
        if mode not in MODES:
            raise TextError(f"{where}unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        problem = text_problem(mode, text or "", text_frontend=self.text_frontend)
        if problem:
            raise TextError(where + problem)
        head, body = target_parts(mode, text)
        if mode == "zero_shot":
            if not prompt_text or not prompt_text.strip():
                raise TextError(f"{where}zero_shot needs the prompt transcript (prompt_text)")
            prompt = zero_shot_prompt(prompt_text)
        elif mode == "instruct2":
            if not instruct or not instruct.strip():
                raise TextError(f"{where}instruct2 needs an instruction (instruct)")
            prompt = instruct_prompt(instruct)
        else:
            prompt = ""
        pieces = self.segments(body)
        if not any(has_speech(p) for p in pieces):  # speakable() said yes; kept as a guard
            raise TextError(f"{where}text has nothing to speak after normalization")
        if mode == "cross_lingual":
            # One segment: exactly the official text (verbatim behind the prefix). More: the official
            # code would feed it unsplit and overflow; split it and repeat the prefix.
            texts = [head + body] if len(pieces) == 1 else [head + p for p in pieces]
        else:
            texts = pieces
        prompt_ids = self.prompt_ids_cache.get_or_compute(prompt, lambda: tuple(self.encode(prompt))) \
            if prompt else ()
        segments = tuple(Segment(text=t, ids=tuple(self.encode(t))) for t in texts)
        for i, seg in enumerate(segments):
            if ENDOFPROMPT_ID not in prompt_ids and ENDOFPROMPT_ID not in seg.ids:
                raise TextError(f"{where}{ENDOFPROMPT} (id {ENDOFPROMPT_ID}) missing from the LLM input of "
                                f"segment {i + 1}")
        return TextPlan(mode=mode, prompt_text=prompt, prompt_ids=prompt_ids, segments=segments)

    def build_text(self, mode: Mode, prompt_text: str | None, text: str, instruct: str | None = None,
                   *, row_id: str | None = None) -> tuple[list[int], list[list[int]]]:
        """(prompt ids, per-segment target ids) of :meth:`plan`."""
        plan = self.plan(mode, prompt_text, text, instruct, row_id=row_id)
        return list(plan.prompt_ids), [list(s.ids) for s in plan.segments]
