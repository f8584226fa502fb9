"""Shards of an export: Parquet files ``datasets`` reads with an Audio column, or WebDataset tars.

Shards are written into the export's private staging folder (cosyclone/export/lock.py swaps
it in whole), one at a time. A shard is closed before the row that would carry it past the size
limit or ``--rows-per-shard`` (a row larger than the limit gets a shard of its own). Names follow
the Hub's convention, ``<prefix>-00000-of-00012.parquet`` (``.tar`` for WebDataset), the count
known when the last shard closes: the prefix is the split (``train``, ``validation``) with
``--split``, else ``data``, not ``train``, because ``datasets`` reads a file named after a split as
that split, and the default export directory lies inside the run folder, which
``load_dataset("audiofolder", data_dir=OUT)`` must keep reading as one set of audio files.

Parquet: an ``audio`` column of struct {bytes, path} (the file as the folder holds it, and its
name; ``prompt`` the same for the prompt recording with ``--include-prompt-audio``) plus the
columns of :mod:`cosyclone.folder.columns`, in row groups of 100 rows (what ``datasets`` itself
writes for audio, so the Hub's viewer and streaming read a row group cheaply), snappy-compressed.
Dictionary encoding for the scalar columns only (no two rows' audio are alike) and min/max
statistics only for those a reader filters on: the footer, held in memory until a shard closes,
keeps a few hundred bytes per row group. The schema carries the ``huggingface`` metadata
``datasets`` reads its features from: ``Audio(sampling_rate=R)``, ``Value``s, ``Sequence``s.

WebDataset: per row ``<key>.wav`` (or ``.flac``), ``<key>.prompt.<ext>`` with the prompt, and
``<key>.json`` (the same columns, as JSON: a seed as a decimal string). A key is the id with
every byte outside ``[A-Za-z0-9_-]`` written ``%XX``: webdataset splits a member's name at its
first dot, so a dot in an id would split the row; the escape is one-to-one and the json keeps the
real id. Tar headers are fixed (mtime 0, uid/gid 0, no user names, mode 0644, PAX for names over
100 bytes), so the same rows give the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cosyclone.base.atomic import fsync_dir
from cosyclone.folder import layout as runfolder
from cosyclone.folder.columns import ColumnSet, ColumnType
from cosyclone.options import ExportFormat

EXTENSIONS: dict[str, str] = {"parquet": ".parquet", "webdataset": ".tar"}  # the sharded formats
SHARD_PREFIX = "data"  # without --split
ROW_GROUP_ROWS = 100  # rows per Parquet row group (datasets' own choice for audio)
ROW_GROUP_BYTES = 32 * 2**20  # ... or fewer, when their audio passes this: the buffer's bound
_KEY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


@dataclass(frozen=True)
class Blob:
    """An audio file carried into a shard."""

    data: bytes  # the file's bytes as they are on disk
    name: str  # its file name (the audio column's path; its suffix is the tar member's)

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix


@dataclass(frozen=True)
class ExportRow:
    """One row as a shard takes it."""

    row_id: str  # the manifest id
    audio: Blob  # the row's audio file
    columns: dict[str, Any]  # every column's value, by name (ColumnSet.values)
    prompt: Blob | None = None  # the prompt recording (--include-prompt-audio)
    file: Path | None = None  # the audio file's absolute path (what the manifest formats point at)

    @property
    def size(self) -> int:
        """Bytes it adds to a shard before compression: its files and its text."""
        return len(self.audio.data) + (len(self.prompt.data) if self.prompt else 0) + sum(
            len(v) for v in self.columns.values() if isinstance(v, str))


@dataclass(frozen=True)
class ShardInfo:
    """A written shard."""

    path: Path  # its final name
    rows: int  # rows it holds
    bytes: int  # its size on disk
    split: str = SHARD_PREFIX  # the split it belongs to (data without --split)


def wds_key(row_id: str) -> str:
    """The WebDataset key of an id: bytes outside ``[A-Za-z0-9_-]`` as ``%XX`` (no dots, one-to-one)."""
    return "".join(chr(b) if b in _KEY_SAFE else f"%{b:02X}" for b in row_id.encode("utf-8", "surrogatepass"))


def shard_name(prefix: str, fmt: ExportFormat, index: int, count: int | None = None) -> str:
    """``data-00003-of-00012.parquet``; without ``count`` the working name ``data-00003.parquet``."""
    tail = "" if count is None else f"-of-{count:05d}"
    return f"{prefix}-{index:05d}{tail}{EXTENSIONS[fmt]}"


class Shard(Protocol):
    """One shard being written to its temporary file."""

    rows: int

    def add(self, row: ExportRow) -> None: ...

    # the shard's size on disk once closed, with ``row`` added
    def size_with(self, row: ExportRow) -> int: ...

    def close(self) -> None: ...  # everything in the file and fsynced


class ParquetShard:
    """A Parquet file written a row group at a time (at most ROW_GROUP_ROWS rows buffered)."""

    def __init__(self, path: Path, *, sample_rate: int, cols: ColumnSet, prompt: bool) -> None:
        import pyarrow.parquet as pq

        self.path, self.cols, self.prompt, self.rows = path, cols, prompt, 0
        self.schema = parquet_schema(sample_rate, cols, prompt)
        leaves = [f"{c.name}.list.element" if c.type.startswith("list") else c.name for c in cols.columns]
        stats = [leaf for leaf, c in zip(leaves, cols.columns, strict=True) if c.stats]
        self._writer = pq.ParquetWriter(str(path), self.schema, compression="snappy", write_statistics=stats,
                                        use_dictionary=leaves)
        self._buffer: list[ExportRow] = []
        self._buffered = 0

    def add(self, row: ExportRow) -> None:
        self._buffer.append(row)
        self._buffered += row.size
        self.rows += 1
        if len(self._buffer) >= ROW_GROUP_ROWS or self._buffered >= ROW_GROUP_BYTES:
            self._flush()

    @staticmethod
    def _blobs(blobs: list[Blob | None]) -> Any:
        import pyarrow as pa

        # built from flat arrays: converting dicts costs several times more
        return pa.StructArray.from_arrays(
            [pa.array([b.data if b else None for b in blobs], pa.binary()),
             pa.array([b.name if b else None for b in blobs], pa.string())], names=["bytes", "path"],
            mask=pa.array([b is None for b in blobs], pa.bool_()))

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._buffer:
            return
        arrays = [self._blobs([r.audio for r in self._buffer])]
        if self.prompt:
            arrays.append(self._blobs([r.prompt for r in self._buffer]))
        arrays += [pa.array([r.columns.get(c.name) for r in self._buffer], arrow_type(c.type))
                   for c in self.cols.columns]
        self._writer.write_table(
            pa.Table.from_arrays(arrays, schema=self.schema), row_group_size=ROW_GROUP_ROWS
        )
        self._buffer, self._buffered = [], 0

    def size_with(self, row: ExportRow) -> int:
        """About the file's size with ``row``: bytes written, plus buffered and new values uncompressed."""
        return self.path.stat().st_size + self._buffered + row.size

    def close(self) -> None:
        self._flush()
        self._writer.close()
        fsync_dir(self.path)


def arrow_type(name: ColumnType) -> Any:
    """The Arrow type of a column type."""
    import pyarrow as pa

    return {"string": pa.string(), "int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
            "bool": pa.bool_(), "list<string>": pa.list_(pa.string())}[name]


def _feature(name: str) -> dict[str, Any]:
    """The ``datasets`` feature of a column type, as ``Features.to_dict`` writes it."""
    if name.startswith("list<"):
        return {"feature": _feature(name[5:-1]), "_type": "Sequence"}
    return {"dtype": name, "_type": "Value"}


def parquet_schema(sample_rate: int, cols: ColumnSet, prompt: bool = False) -> Any:
    """The arrow schema of an export, with the ``huggingface`` features ``datasets`` decodes it by."""
    import pyarrow as pa

    audio = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    features: dict[str, Any] = {"audio": {"sampling_rate": sample_rate, "_type": "Audio"}}
    fields_ = [("audio", audio)]
    if prompt:  # the prompt's own rate: decoded as it is
        features["prompt"] = {"_type": "Audio"}
        fields_.append(("prompt", audio))
    features.update((c.name, _feature(c.type)) for c in cols.columns)
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema([*fields_, *((c.name, arrow_type(c.type)) for c in cols.columns)], metadata=meta)


class TarShard:
    """A WebDataset tar: ``<key><suffix>`` and ``<key>.json`` per row, fixed headers.

    Written block by block (``TarInfo.tobuf`` headers, 512-byte padding, the two end blocks and
    the padding to tarfile's 10240-byte records) rather than through ``tarfile.TarFile``, which
    keeps every member's TarInfo for the life of the archive: memory that grew with the shard.
    """

    def __init__(self, path: Path, cols: ColumnSet) -> None:
        self.path, self.cols, self.rows = path, cols, 0
        self._fh = open(path, "wb")  # noqa: SIM115 (closed in close())

    def _members(self, row: ExportRow) -> list[bytes]:
        """The row's members as header, data and padding, each a multiple of 512 bytes."""
        key = wds_key(row.row_id)
        meta = json.dumps(self.cols.json_values(row.columns), ensure_ascii=False, sort_keys=True)
        members = [(key + row.audio.suffix, row.audio.data)]
        if row.prompt is not None:
            members.append((key + ".prompt" + row.prompt.suffix, row.prompt.data))
        members.append((key + ".json", meta.encode()))
        out = []
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = (
                len(data),
                0,
                0o644,
                0,
                0,
                "",
                "",
            )
            header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            out += [header, data, b"\0" * (-len(data) % tarfile.BLOCKSIZE)]
        return out

    def add(self, row: ExportRow) -> None:
        for part in self._members(row):
            self._fh.write(part)
        self.rows += 1

    def size_with(self, row: ExportRow) -> int:
        """The tar's exact size once closed with ``row`` added."""
        size = self._fh.tell() + sum(len(p) for p in self._members(row)) + 2 * tarfile.BLOCKSIZE
        return -(-size // tarfile.RECORDSIZE) * tarfile.RECORDSIZE

    def close(self) -> None:
        end = self._fh.tell() + 2 * tarfile.BLOCKSIZE
        self._fh.write(b"\0" * (2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


class ShardWriter:
    """Rows into numbered shards of at most ``limit`` bytes (roughly, for Parquet) and ``max_rows`` rows."""

    def __init__(self, to_dir: Path, fmt: ExportFormat, prefix: str, limit: int, max_rows: int | None,
                 make: Callable[[Path], Shard], log: Callable[[str], None]) -> None:
        self.to_dir, self.fmt, self.prefix, self.limit, self.max_rows = to_dir, fmt, prefix, limit, max_rows
        self.make, self.log = make, log
        self.written: list[ShardInfo] = []
        self._shard: Shard | None = None
        self._path: Path | None = None

    def add(self, row: ExportRow) -> None:
        where = self._path
        try:
            full = self._shard is not None and self._shard.rows and (
                (self.max_rows is not None and self._shard.rows >= self.max_rows)
                or self._shard.size_with(row) > self.limit)
            if full:
                self._finish()
            if self._shard is None:
                self._path = where = self.to_dir / shard_name(self.prefix, self.fmt, len(self.written))
                self._shard = self.make(self._path)
            assert self._shard is not None
            self._shard.add(row)
        except OSError as exc:
            raise runfolder.OutputFolderError(f"cannot write {where}: {exc.strerror or exc}") from exc

    def _finish(self) -> None:
        assert self._shard is not None and self._path is not None
        self._shard.close()
        info = ShardInfo(
            path=self._path, rows=self._shard.rows, bytes=self._path.stat().st_size, split=self.prefix
        )
        self.written.append(info)
        self._shard = self._path = None
        self.log(f"{info.path.name}: {info.rows} rows, {info.bytes} bytes")

    def abandon(self) -> None:
        """After a failure: the open shard closed (the staging folder goes as a whole)."""
        if self._shard is not None:
            with contextlib.suppress(Exception):
                self._shard.close()
        self._shard = self._path = None

    def close(self) -> list[ShardInfo]:
        """The last shard finished, then every shard renamed ``-of-N`` (its count now known): the shards."""
        try:
            if self._shard is not None:
                self._finish()
            count = len(self.written)
            named = []
            for i, info in enumerate(self.written):
                final = self.to_dir / shard_name(self.prefix, self.fmt, i, count)
                os.replace(info.path, final)
                named.append(dataclasses.replace(info, path=final))
        except OSError as exc:
            self.abandon()
            raise runfolder.OutputFolderError(
                f"cannot write in {self.to_dir}: {exc.strerror or exc}"
            ) from exc
        self.written = named
        return named

