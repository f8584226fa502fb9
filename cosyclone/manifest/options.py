"""What ``cosyclone validate`` takes besides the manifest, declared in the option registry.

Like a run's options (:mod:`cosyclone.options`): one field per option with its flag, help line and
panel, so ``--help``, docs/cli.md and the bounds check read one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosyclone.options import VALIDATE, check, opt

PLAN = "Text plan"


@dataclass(frozen=True)
class ValidateOptions:
    """What ``cosyclone validate`` reads besides the manifest and what it prints (no weights are read)."""

    # the model directory whose tokenizer gives real token counts (None: a built-in stand-in tokenizer)
    model_dir: Path | None = opt(None, "model folder: its tokenizer gives real token counts", panel=PLAN,
                                 metavar="DIR", commands=(VALIDATE,))
    # print each row's normalized segments and token counts
    show_text: bool = opt(False, "print each row's normalized segments and token counts", panel=PLAN,
                          commands=(VALIDATE,))
    # one JSON object per row on stdout: {id, mode, prompt_ids, segments: [{text, ids}]} or {id, error}
    json_out: bool = opt(False, "one JSON object per row on stdout", panel=PLAN, flag="--json",
                         commands=(VALIDATE,))

    def __post_init__(self) -> None:
        check(self)
