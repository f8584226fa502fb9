"""The manifest formats of ``cosyclone export``: a NeMo manifest and Lhotse manifests.

Unlike the shards (cosyclone/export/shards.py), these hold no audio: each line points at the
run folder's file by its absolute path, as NeMo's and Lhotse's own data preparation do, so the run
folders must stay where they are for the manifests to load. Every column of
:mod:`cosyclone.folder.columns` travels along (NeMo: beside ``audio_filepath``, ``duration`` and
``text``; Lhotse: in each supervision's ``custom``, ``speaker`` and ``language`` taken from the
flat meta keys of those names), JSON-valued the way every JSON output writes them (a seed as a
decimal string).

NeMo: ``manifest.jsonl`` (``manifest_<split>.jsonl`` with ``--split``), one JSON object a line.
Lhotse: ``recordings.jsonl.gz`` and ``supervisions.jsonl.gz`` (``..._<split>.jsonl.gz``), written with the
``lhotse`` library (the ``lhotse`` extra: ``pip install -e '.[lhotse]'``) so that its own readers load them; a
recording's and its supervision's id are the row's id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError
from cosyclone.export.shards import SHARD_PREFIX, ExportRow, ShardInfo
from cosyclone.folder import layout as runfolder
from cosyclone.folder.columns import ColumnSet

#: Keys NeMo's manifest parser reads from a line's top level (a file to load, where in it, its language...):
#: a ``meta`` key of one of these names stays inside ``meta``, or NeMo would load what the key names.
NEMO_LOADER_KEYS = frozenset({
    "audio_filepath", "audio_filename", "audio_file", "offset", "duration", "orig_sample_rate", "orig_sr",
    "lang", "token_labels", "text_filepath", "text", "normalized_text", "answer", "context", "question",
})


def scalar_label(value: Any) -> str | None:
    """A speaker or language label from a row's meta: a string or a number as text (LibriTTS speaker ids are
    numbers), None for anything else (a list, an object, a bool)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return value if isinstance(value, str) else str(value)


def _suffix(split: str) -> str:
    return "" if split == SHARD_PREFIX else f"_{split}"


class NemoManifest:
    """One split's NeMo manifest, a line per row."""

    def __init__(self, to_dir: Path, split: str, cols: ColumnSet, log: Callable[[str], None]) -> None:
        self.path = to_dir / f"manifest{_suffix(split)}.jsonl"
        self.split, self.cols, self.log, self.rows = split, cols, log, 0
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def add(self, row: ExportRow) -> None:
        assert row.file is not None
        line = {"audio_filepath": str(row.file), **self.cols.json_values(row.columns)}
        self._fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.rows += 1

    def abandon(self) -> None:
        self._fh.close()

    def close(self) -> list[ShardInfo]:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        info = ShardInfo(path=self.path, rows=self.rows, bytes=self.path.stat().st_size, split=self.split)
        self.log(f"{self.path.name}: {self.rows} rows, {info.bytes} bytes")
        return [info]


def _lhotse() -> Any:
    try:
        import lhotse
        from lhotse.audio import AudioSource
        from lhotse.serialization import SequentialJsonlWriter
    except ImportError:
        raise CosycloneError("--format lhotse writes with the lhotse library: from the cosyclone checkout, "
                             "pip install -e '.[lhotse]'") from None
    return lhotse, AudioSource, SequentialJsonlWriter


class LhotseManifests:
    """One split's Lhotse recordings and supervisions, written as they come."""

    def __init__(self, to_dir: Path, split: str, cols: ColumnSet, log: Callable[[str], None]) -> None:
        self.lhotse, self.source, writer = _lhotse()
        self.split, self.cols, self.log, self.rows = split, cols, log, 0
        self.paths = (to_dir / f"recordings{_suffix(split)}.jsonl.gz",
                      to_dir / f"supervisions{_suffix(split)}.jsonl.gz")
        self._recordings, self._supervisions = writer(self.paths[0]), writer(self.paths[1])

    def add(self, row: ExportRow) -> None:
        assert row.file is not None
        values = row.columns
        rate, duration = int(values["sample_rate"]), float(values["duration"])
        recording = self.lhotse.Recording(
            id=row.row_id, sources=[self.source(type="file", channels=[0], source=str(row.file))],
            sampling_rate=rate, num_samples=round(duration * rate), duration=duration)
        custom = {k: v for k, v in self.cols.json_values(values).items()
                  if k not in ("id", "text", "duration", "speaker", "language")}
        meta = json.loads(values["meta"]) if isinstance(values.get("meta"), str) else None
        meta = meta if isinstance(meta, dict) else {}
        supervision = self.lhotse.SupervisionSegment(
            id=row.row_id, recording_id=row.row_id, start=0.0, duration=duration, channel=0,
            text=values.get("text"), speaker=scalar_label(meta.get("speaker")),
            language=scalar_label(meta.get("language")), custom=custom)
        self._recordings.write(recording)
        self._supervisions.write(supervision)
        self.rows += 1

    def abandon(self) -> None:
        for w in (self._recordings, self._supervisions):
            w.close()

    def close(self) -> list[ShardInfo]:
        self.abandon()
        out = []
        for path in self.paths:
            if not path.exists():  # lhotse opens its file on the first write: an empty split writes none
                runfolder.write_bytes_atomic(path, _empty_gzip())
            info = ShardInfo(path=path, rows=self.rows, bytes=path.stat().st_size, split=self.split)
            self.log(f"{path.name}: {self.rows} rows, {info.bytes} bytes")
            out.append(info)
        return out


def _empty_gzip() -> bytes:
    import gzip

    return gzip.compress(b"", mtime=0)
