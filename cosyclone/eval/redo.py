"""``redo.jsonl``: the failing rows as a manifest, each with a new seed, to resynthesize in place.

``cosyclone synth OUT/redo.jsonl --out OUT`` then redoes exactly those rows: every line is the
row's original manifest object (same id, text, prompt, mode, speed ...), with two changes:

* ``prompt_audio`` is made absolute, because the file now lives in OUT, not beside the manifest
  the relative path was written against;
* ``seed`` is the next seed of the row's redo chain, ``redo_seed(id, seed that made the WAV)``: a
  63-bit blake2b hash, so it is deterministic (running eval twice writes the same file), differs
  from every earlier attempt of the row (each redo hashes the seed of the previous one, and the
  seed is taken from the row's diagnostics, i.e. the attempt actually on disk), and changes the
  row's fingerprint, which is what makes the resumable synth redo it instead of skipping it.

A row whose seed nobody recorded (no diagnostics seed, no manifest seed) starts its chain from the
run seed 0 the synth default would have used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cosyclone.base.atomic import write_atomic
from cosyclone.eval.folder import FolderRow

REDO_NAME = "redo.jsonl"
SEED_BITS = 63  # the manifest's seeds are non-negative 64-bit-safe ints, like the sampler's row_seed


def redo_seed(row_id: str, seed: int) -> int:
    """The seed after ``seed`` in row ``row_id``'s redo chain (non-negative, < 2**63)."""
    digest = hashlib.blake2b(f"cosyclone-redo\x00{row_id}\x00{int(seed)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)


def current_seed(frow: FolderRow) -> int:
    """The seed of the attempt on disk (diagnostics, then manifest, then what run seed 0 derives)."""
    seed = frow.seed
    if seed is not None:
        return int(seed)
    from cosyclone.talker.sampler import row_seed

    return row_seed(0, frow.row.id)


def redo_line(frow: FolderRow) -> dict[str, Any]:
    """The manifest object that redoes ``frow``: original fields, absolute prompt path, next seed."""
    obj = dict(frow.raw)
    obj["prompt_audio"] = str(Path(frow.row.prompt_audio).resolve())
    obj["seed"] = redo_seed(frow.row.id, current_seed(frow))
    return obj


def write_redo(out_dir: Path, rows: Iterable[FolderRow]) -> Path:
    """Write ``OUT/redo.jsonl`` (atomically; an empty file when no row fails) and return its path."""
    path = Path(out_dir) / REDO_NAME
    lines = (json.dumps(redo_line(frow), ensure_ascii=False) + "\n" for frow in rows)
    write_atomic(path, (line.encode("utf-8") for line in lines))
    return path
