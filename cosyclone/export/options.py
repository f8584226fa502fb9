"""What ``cosyclone export`` writes and from what, declared in the option registry (none changes a row).

Like a run's options (:mod:`cosyclone.options`): one field per option with its flag, help line and
panel, so ``--help``, docs/cli.md and the bounds check read one table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cosyclone.errors import CosycloneError
from cosyclone.options import EXPORT, SHARDS, SOURCES, ExportFormat, check, opt

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?(b?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ExportOptions:
    """What ``cosyclone export`` writes and from what (cosyclone/export/build.py; none changes a row)."""

    # parquet | webdataset shards (the audio inside), nemo | lhotse manifests (pointing at the folders' files)
    format: ExportFormat = opt("parquet", "parquet | webdataset | nemo | lhotse", panel=SHARDS, metavar="FMT",
                               commands=(EXPORT,))
    # the largest shard: 500MB, 2GB, 100KB (powers of 1000), 1GiB (of 1024) or bytes
    shard_size: str = opt("500MB", "largest shard: 500MB, 2GB, 100KB or bytes", panel=SHARDS, metavar="SIZE",
                          commands=(EXPORT,))
    # at most this many rows a shard (None: only --shard-size bounds a shard)
    rows_per_shard: int | None = opt(None, "at most N rows a shard", panel=SHARDS, low=1, metavar="N",
                                     commands=(EXPORT,))
    # where the export goes (None: OUT/export/FORMAT of the one folder given)
    to: str | None = opt(None, "target folder (default: OUT/export/FMT)", panel=SHARDS, metavar="DIR",
                         commands=(EXPORT,))
    # NAME=FRACTION, repeatable: that share of the rows (by a hash of the id) goes to split NAME, the rest to
    # train
    split: list[str] | None = opt(None, "NAME=FRACTION by id hash, e.g. validation=0.02", panel=SHARDS,
                                  metavar="NAME=F", commands=(EXPORT,))
    # embed each row's prompt recording (Parquet: a second audio column; WebDataset: <key>.prompt.<ext>)
    include_prompt_audio: bool = opt(
        False, "embed the prompt recording too", panel=SHARDS, commands=(EXPORT,)
    )
    # only the rows `cosyclone eval` passed (needs OUT/scores.jsonl)
    only_passed: bool = opt(False, "only rows that passed cosyclone eval", panel=SOURCES, commands=(EXPORT,))
    # export a folder a live `synth` is writing (what it finished so far; the marker says "running")
    allow_running: bool = opt(False, "export a folder a synth is still writing", panel=SOURCES,
                              commands=(EXPORT,))

    def __post_init__(self) -> None:
        check(self)


def parse_size(text: str) -> int:
    """Bytes of ``500MB``, ``2GB``, ``100KB``, ``1.5GiB`` or a plain number (KB/MB/GB decimal, KiB/MiB/GiB
    binary)."""
    m = _SIZE.match(str(text))
    if m is None or (m.group(2) is None and m.group(3)):
        raise CosycloneError(f"--shard-size must be a size such as 500MB, 2GB, 100KB or a number of bytes, "
                             f"not {text!r}")
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if size < 1:
        raise CosycloneError(f"--shard-size must be at least 1 byte, not {text!r}")
    return size
