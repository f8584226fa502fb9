"""``cosyclone validate``'s text check: each valid row planned as the LLM will read it, no weights read.

Owns the row's text plan (normalized, split, tokenized) and the check that every segment fits the
model's positions. Whatever planning a row raises is that row's error, never the command's: a
tokenizer or normalizer tripping on one text must not stop the other rows being checked. Must not
print (the command does) or read model weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError, ManifestError
from cosyclone.manifest.rows import PROMPT_TOKENS_PER_SECOND, ManifestRow
from cosyclone.options import TextFrontendName


class TextCheck:
    """A text frontend and the configuration whose position limits apply.

    With ``model_dir`` its tokenizer gives the real token counts; without one the built-in stand-in
    tokenizer is used, as dummy runs do (``stand_in`` is then True: English counts can differ).
    """

    def __init__(self, model_dir: Path | None, text_frontend: TextFrontendName) -> None:
        from cosyclone.frontend.text import TextFrontend
        from cosyclone.model.config import QWEN_DIR, load_model_config, released_config

        self.stand_in = model_dir is None
        if model_dir is not None:
            self.cfg = load_model_config(model_dir)
            qwen = model_dir / QWEN_DIR
        else:
            from cosyclone.frontend.tiny_assets import builtin_assets_dir

            self.cfg = released_config()
            qwen = builtin_assets_dir() / QWEN_DIR
        self.text = TextFrontend(qwen, text_frontend=text_frontend)

    def plan(self, row: ManifestRow) -> Any:
        """The row's text plan (``prompt_ids``, ``segments``); :class:`ManifestError` (field ``text``,
        the row's line) when it cannot be planned or a segment would not fit the LLM."""
        try:
            plan = self.text.plan(row.mode, row.prompt_text, row.text, row.instruct, row_id=row.id)
            speech = round(PROMPT_TOKENS_PER_SECOND * row.prompt_seconds) if row.mode == "zero_shot" else 0
            plan.check_fit(
                max_positions=self.cfg.talker.qwen.max_position_embeddings,
                max_len_ratio=self.cfg.talker.max_len_ratio,
                prompt_speech_tokens=speech,
                row_id=row.id,
            )
        except CosycloneError as exc:
            reason = str(exc).removeprefix(f"row {row.id!r}: ")
            raise ManifestError(reason, line=row.line, field="text", row_id=row.id) from None
        except Exception as exc:  # a bug or a library tripping on this text: the row's error, with its type
            raise ManifestError(
                f"the text could not be planned ({type(exc).__name__}: {exc})",
                line=row.line,
                field="text",
                row_id=row.id,
            ) from exc
        return plan
