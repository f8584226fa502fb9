"""Where ``cosyclone eval`` keeps its files in a run folder, and where older versions kept them.

Why these names: the folder loads as it lies with ``datasets.load_dataset("audiofolder")``, whose
split inference takes any file named ``eval...``, ``test...`` or ``valid...`` for a split of its own
(and then fails: that split holds no audio). Eval's records are therefore ``scores.jsonl`` and its
summary ``scores_summary.json``; a folder scored by an older version still reads (its
``eval.jsonl`` and ``eval_summary.json``), and the next eval replaces them by the new names.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

SCORES_NAME = "scores.jsonl"  # one record per manifest row (cosyclone.eval.record.EvalRecord)
SCORES_SUMMARY_NAME = "scores_summary.json"  # the figures over those records
#: the names an older cosyclone wrote, by the name that replaces them
LEGACY = {SCORES_NAME: "eval.jsonl", SCORES_SUMMARY_NAME: "eval_summary.json"}


def scores_path(out_dir: Path, name: str = SCORES_NAME) -> Path:
    """The file ``name`` (:data:`SCORES_NAME` or :data:`SCORES_SUMMARY_NAME`) of ``out_dir`` to read:
    the current name, else the older name when only that exists."""
    path = Path(out_dir) / name
    old = Path(out_dir) / LEGACY[name]
    return old if not path.is_file() and old.is_file() else path


def remove_legacy(out_dir: Path) -> None:
    """Remove the files an older eval wrote under the names audiofolder takes for a split (the current
    names have just been written beside them)."""
    for old in LEGACY.values():
        with contextlib.suppress(FileNotFoundError):
            (Path(out_dir) / old).unlink()
