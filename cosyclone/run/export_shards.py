"""Shards of an export: Parquet files ``datasets`` reads with an Audio column, or WebDataset tars.

Each shard is written to a temporary name beside it, fsynced and renamed: a shard in the export
directory is always whole. A shard is closed before the row that would carry it past the size
limit (a row larger than the limit gets a shard of its own). Names are ``data-00000.parquet``,
``data-00001.parquet``, ... (``.tar`` for WebDataset): ``data``, not ``train``, because ``datasets``
reads a file named after a split as that split, and the default export directory lies inside the
run folder, which ``load_dataset("audiofolder", data_dir=OUT)`` must keep reading as one set of WAVs.

Parquet: an ``audio`` column of struct {bytes, path} (the file as the folder holds it, and its
name) plus the scalar columns, in row groups of 100 rows (what ``datasets`` itself writes for
audio, so the Hub's viewer and streaming read a row group cheaply), snappy-compressed. Dictionary
encoding for the scalar columns only (no two rows' audio are alike) and min/max statistics only for
those a reader filters on (id, mode, seed, duration, eval verdicts): the footer, held in memory
until a shard closes, keeps a few hundred bytes per row group, not the audio's or the texts' ends.
The schema carries the ``huggingface`` metadata ``datasets`` reads its features from:
``Audio(sampling_rate=R)``, ``Value``s and a ``Sequence`` for the list of failed eval checks.

WebDataset: per row ``<key>.wav`` (or ``.flac``) and ``<key>.json`` (the same columns, plus
``sample_rate``). A key is the id with every byte outside ``[A-Za-z0-9_-]`` written ``%XX``:
webdataset splits a member's name at its first dot, so a dot in an id would split the row; the
escape is one-to-one and the json keeps the real id. Tar headers are fixed (mtime 0, uid/gid 0,
no user names, mode 0644, PAX for names over 100 bytes), so the same rows give the same bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from cosyclone.run import folder as runfolder

ExportFormat = Literal["parquet", "webdataset"]
EXTENSIONS: dict[str, str] = {"parquet": ".parquet", "webdataset": ".tar"}
SHARD_PREFIX = "data"
ROW_GROUP_ROWS = 100  # rows per Parquet row group (datasets' own choice for audio)
ROW_GROUP_BYTES = 32 * 2**20  # ... or fewer, when their audio passes this: the buffer's bound
# Columns of free text: no min/max statistics (a row group's longest texts, kept in the footer, filter nothing)
FREE_TEXT = frozenset({"text", "prompt_text", "prompt_audio", "instruct", "eval_transcript"})
_KEY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")

# Column name -> (arrow type name, datasets feature); the order is the Parquet column order.
BASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "string"), ("text", "string"), ("prompt_text", "string"), ("prompt_audio", "string"),
    ("mode", "string"), ("instruct", "string"), ("seed", "int64"), ("duration", "float64"))
EVAL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("eval_status", "string"), ("eval_passed", "bool"), ("eval_fails", "list<string>"),
    ("eval_metric", "string"), ("eval_error_rate", "float64"), ("eval_wer", "float64"), ("eval_cer", "float64"),
    ("eval_transcript", "string"), ("eval_lead_silence_s", "float64"), ("eval_trail_silence_s", "float64"),
    ("eval_clipped_fraction", "float64"))


@dataclass(frozen=True)
class ExportRow:
    """One row as a shard takes it."""

    row_id: str  # the manifest id
    audio: bytes  # the audio file's bytes as the run folder holds them
    audio_name: str  # ``<id>.wav`` / ``<id>.flac``: the audio column's path, the tar member's suffix
    sample_rate: int  # of the audio file
    columns: dict[str, Any]  # every scalar column of the export, by name

    @property
    def suffix(self) -> str:
        return Path(self.audio_name).suffix


@dataclass(frozen=True)
class ShardInfo:
    """A written shard."""

    path: Path  # its final name
    rows: int  # rows it holds
    bytes: int  # its size on disk


def similarity_column(backend: str) -> str:
    """The column of a speaker backend's similarity (``eval_similarity_campplus``)."""
    return "eval_similarity_" + re.sub(r"[^a-z0-9_]", "_", backend.lower())


def columns(eval_backends: tuple[str, ...] | None) -> list[tuple[str, str]]:
    """The scalar columns of an export: the base ones, then eval's when the folder has eval.jsonl."""
    if eval_backends is None:
        return list(BASE_COLUMNS)
    return [*BASE_COLUMNS, *EVAL_COLUMNS, *((similarity_column(b), "float64") for b in eval_backends)]


def wds_key(row_id: str) -> str:
    """The WebDataset key of an id: bytes outside ``[A-Za-z0-9_-]`` as ``%XX`` (no dots, one-to-one)."""
    return "".join(chr(b) if b in _KEY_SAFE else f"%{b:02X}" for b in row_id.encode("utf-8", "surrogatepass"))


def shard_name(fmt: ExportFormat, index: int) -> str:
    return f"{SHARD_PREFIX}-{index:05d}{EXTENSIONS[fmt]}"


def clear_shards(to_dir: Path, fmt: ExportFormat) -> list[Path]:
    """Remove an earlier export's shards of ``fmt`` from ``to_dir``, and temporaries of dead exports here."""
    ext = re.escape(EXTENSIONS[fmt])
    shard = re.compile(rf"^{SHARD_PREFIX}-\d{{5,}}{ext}$")
    temp = re.compile(rf"^\.{SHARD_PREFIX}-\d{{5,}}{ext}\.(.+)\.(\d+)\.tmp$")
    removed = []
    try:
        for path in sorted(to_dir.iterdir()) if to_dir.is_dir() else []:
            m = temp.match(path.name)
            stale = m is not None and m.group(1) == socket.gethostname() and not runfolder.pid_alive(int(m.group(2)))
            if shard.match(path.name) or stale:
                path.unlink()
                removed.append(path)
        if removed:
            runfolder.fsync_dir(to_dir)
    except OSError as exc:
        raise runfolder.OutputFolderError(f"cannot remove the earlier shards in {to_dir}: {exc.strerror or exc}") from exc
    return removed


class Shard(Protocol):
    """One shard being written to its temporary file."""

    rows: int

    def add(self, row: ExportRow) -> None: ...

    def size_with(self, row: ExportRow) -> int: ...  # the shard's size on disk once closed, with ``row`` added

    def close(self) -> None: ...  # everything in the file and fsynced


class ParquetShard:
    """A Parquet file written a row group at a time (at most ROW_GROUP_ROWS rows buffered)."""

    def __init__(self, path: Path, *, sample_rate: int, cols: list[tuple[str, str]]) -> None:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        self.path, self.cols, self.rows = path, cols, 0
        self.schema = parquet_schema(sample_rate, cols)
        leaves = [f"{n}.list.element" if t.startswith("list") else n for n, t in cols]
        stats = [n for n in leaves if n not in FREE_TEXT]
        self._writer = pq.ParquetWriter(str(path), self.schema, compression="snappy", write_statistics=stats,
                                        use_dictionary=leaves)
        self._buffer: list[ExportRow] = []
        self._buffered = 0

    def add(self, row: ExportRow) -> None:
        self._buffer.append(row)
        self._buffered += len(row.audio) + sum(len(v) for v in row.columns.values() if isinstance(v, str))
        self.rows += 1
        if len(self._buffer) >= ROW_GROUP_ROWS or self._buffered >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa  # type: ignore[import-untyped]

        if not self._buffer:
            return
        audio = pa.StructArray.from_arrays(  # built from flat arrays: converting dicts costs several times more
            [pa.array([r.audio for r in self._buffer], pa.binary()),
             pa.array([r.audio_name for r in self._buffer], pa.string())], names=["bytes", "path"])
        arrays = [audio, *(pa.array([r.columns.get(n) for r in self._buffer], _arrow_type(t)) for n, t in self.cols)]
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema), row_group_size=ROW_GROUP_ROWS)
        self._buffer, self._buffered = [], 0

    def size_with(self, row: ExportRow) -> int:
        """About the file's size with ``row``: bytes written, plus buffered and new values uncompressed."""
        new = len(row.audio) + sum(len(v) for v in row.columns.values() if isinstance(v, str))
        return self.path.stat().st_size + self._buffered + new

    def close(self) -> None:
        self._flush()
        self._writer.close()
        runfolder.fsync_dir(self.path)


def _arrow_type(name: str) -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]

    return {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
            "list<string>": pa.list_(pa.string())}[name]


def _feature(name: str) -> dict[str, Any]:
    """The ``datasets`` feature of an arrow type name, as ``Features.to_dict`` writes it."""
    if name.startswith("list<"):
        return {"feature": _feature(name[5:-1]), "_type": "Sequence"}
    return {"dtype": name, "_type": "Value"}


def parquet_schema(sample_rate: int, cols: list[tuple[str, str]]) -> Any:
    """The arrow schema of an export, with the ``huggingface`` features ``datasets`` decodes it by."""
    import pyarrow as pa  # type: ignore[import-untyped]

    audio = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    features: dict[str, Any] = {"audio": {"sampling_rate": sample_rate, "_type": "Audio"}}
    features.update((n, _feature(t)) for n, t in cols)
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema([("audio", audio), *((n, _arrow_type(t)) for n, t in cols)], metadata=meta)


class TarShard:
    """A WebDataset tar: ``<key><suffix>`` and ``<key>.json`` per row, fixed headers.

    Written block by block (``TarInfo.tobuf`` headers, 512-byte padding, the two end blocks and
    the padding to tarfile's 10240-byte records) rather than through ``tarfile.TarFile``, which
    keeps every member's TarInfo for the life of the archive: memory that grew with the shard.
    """

    def __init__(self, path: Path) -> None:
        self.path, self.rows = path, 0
        self._fh = open(path, "wb")  # noqa: SIM115 (closed in close())

    @staticmethod
    def _members(row: ExportRow) -> list[bytes]:
        """The row's two members as header, data and padding, each a multiple of 512 bytes."""
        key = wds_key(row.row_id)
        meta = json.dumps({**row.columns, "sample_rate": row.sample_rate}, ensure_ascii=False, sort_keys=True)
        out = []
        for name, data in ((key + row.suffix, row.audio), (key + ".json", meta.encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), 0, 0o644, 0, 0, "", ""
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
    """Rows into numbered shards of at most ``limit`` bytes each (roughly, for Parquet), each atomic."""

    def __init__(self, to_dir: Path, fmt: ExportFormat, limit: int, make: Callable[[Path], Shard],
                 log: Callable[[str], None]) -> None:
        self.to_dir, self.fmt, self.limit, self.make, self.log = to_dir, fmt, limit, make, log
        self.written: list[ShardInfo] = []
        self._shard: Shard | None = None
        self._tmp: Path | None = None

    def add(self, row: ExportRow) -> None:
        try:
            if self._shard is not None and self._shard.rows and self._shard.size_with(row) > self.limit:
                self._finish()
            if self._shard is None:
                self._tmp = runfolder.tmp_name(self.to_dir / shard_name(self.fmt, len(self.written)))
                self._shard = self.make(self._tmp)
            self._shard.add(row)
        except OSError as exc:
            self.abandon()
            raise runfolder.OutputFolderError(f"cannot write {self._tmp}: {exc.strerror or exc}") from exc

    def _finish(self) -> None:
        assert self._shard is not None and self._tmp is not None
        self._shard.close()
        final = self.to_dir / shard_name(self.fmt, len(self.written))
        os.replace(self._tmp, final)
        runfolder.fsync_dir(self.to_dir)
        info = ShardInfo(path=final, rows=self._shard.rows, bytes=final.stat().st_size)
        self.written.append(info)
        self._shard = self._tmp = None
        self.log(f"{info.path}: {info.rows} rows, {info.bytes} bytes")

    def abandon(self) -> None:
        """After a failure: the temporary file goes, nothing torn is left."""
        if self._tmp is not None:
            if self._shard is not None:
                with contextlib.suppress(Exception):
                    self._shard.close()
            with contextlib.suppress(OSError):
                self._tmp.unlink()
        self._shard = self._tmp = None

    def close(self) -> list[ShardInfo]:
        """The last shard finished; every shard written."""
        try:
            if self._shard is not None:
                self._finish()
        except OSError as exc:
            self.abandon()
            raise runfolder.OutputFolderError(f"cannot write in {self.to_dir}: {exc.strerror or exc}") from exc
        return self.written
