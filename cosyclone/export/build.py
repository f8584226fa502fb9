"""``cosyclone export OUT [OUT...]``: run folders' good rows as a training set (Parquet, WebDataset,
NeMo or Lhotse).

The run folders stay the source of truth: export only reads them (records, audio files,
scores.jsonl) and writes elsewhere (by default ``OUT/export/<format>/``, which nothing else reads).
Which rows go and what columns they carry: :mod:`cosyclone.export.rows` and
:mod:`cosyclone.folder.columns`. Rows go in folder order, each folder's in manifest-line order;
``--split NAME=F`` sends a share of them, chosen by a hash of the id, to split NAME.

An export is whole or absent (:mod:`cosyclone.export.lock`): it is built beside the target and
swapped in with its marker ``export.json`` (rows, shards, source folders and their state, each
skipped row's id and reason) only when complete; one export per target at a time; a folder a live
``synth`` is writing is refused unless ``allow_running``; zero rows is an error that keeps the old
export; two folders holding one id is an error naming it.

Memory does not grow with the audio: one row's file is read at a time, and a shard buffers at most
a Parquet row group (100 rows) or one tar member. What grows is the index, 62 bytes per record
line (and 24 per eval line): about 65 MB for a million rows, and the skipped rows' list.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cosyclone.errors import CosycloneError
from cosyclone.export import shards
from cosyclone.export.card import CARD, card, made_by
from cosyclone.export.formats import NEMO_LOADER_KEYS, LhotseManifests, NemoManifest
from cosyclone.export.index import EVAL_NAME, EvalIndex
from cosyclone.export.lock import MARKER, ExportTarget
from cosyclone.export.rows import CORRUPT_RECORD, Skipped, Source, iter_rows, parse_splits, split_of
from cosyclone.export.shards import ExportRow, ShardInfo
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import MODEL_RATE
from cosyclone.folder.columns import RESERVED, ColumnSet, MetaKeys
from cosyclone.folder.lock import live_writers
from cosyclone.folder.record_scan import RecordIndex
from cosyclone.folder.scores import scores_path
from cosyclone.options import EXPORT_FORMATS, ExportFormat

EXPORT_DIR = "export"  # OUT/export/<format>/: the default target
FORMATS = EXPORT_FORMATS
DEFAULT_SHARD_SIZE = "500MB"
DEFAULT_SHARD_BYTES = 500 * 10**6
class NothingToExport(CosycloneError):
    """No row of the folders can be exported: the target keeps its earlier export."""


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote and what it left out."""

    format: ExportFormat  # parquet | webdataset | nemo | lhotse
    to_dir: Path  # where the export is
    sample_rate: int | None  # of every exported file
    rows: int  # rows exported
    shards: tuple[ShardInfo, ...]  # the files written, in order (manifests too)
    records: int  # rows the folders have a record for
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows not exported
    eval_columns: bool = False  # scores.jsonl's verdicts are columns
    splits: dict[str, int] = field(default_factory=dict)  # split -> rows
    corrupt: tuple[str, ...] = ()  # each records line that is not a record, by file, line and byte offset
    empty_splits: tuple[str, ...] = ()  # --split names that no row fell into (too few rows for the fraction)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def describe(self) -> str:
        """One line: rows, shards, size, rate, where, and what was left out."""
        rate = f" at {self.sample_rate} Hz" if self.sample_rate else ""
        left = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items()) if v)
        parts = f" ({', '.join(f'{k} {v}' for k, v in self.splits.items())})" if len(self.splits) > 1 else ""
        empty = (f"; no row fell into split{'s' if len(self.empty_splits) > 1 else ''} "
                 f"{', '.join(self.empty_splits)} ({self.rows} rows are too few for its fraction: give a "
                 "larger one)" if self.empty_splits else "")
        return (
            f"exported {self.rows} of {self.records} rows{parts}{rate} into {len(self.shards)} {self.format} "
            f"file{'' if len(self.shards) == 1 else 's'} ({self.bytes} bytes) in {self.to_dir}"
            + (f"; not exported: {left} (each named in {MARKER})" if left else "")
            + empty
        )


class Sink(Protocol):
    """One split's output: rows in, files out."""

    def add(self, row: ExportRow) -> None: ...

    def abandon(self) -> None: ...

    def close(self) -> list[ShardInfo]: ...


class _Shards:
    """A split's shards (Parquet or WebDataset) as a sink."""

    def __init__(self, writer: shards.ShardWriter) -> None:
        self.writer = writer

    def add(self, row: ExportRow) -> None:
        self.writer.add(row)

    def abandon(self) -> None:
        self.writer.abandon()

    def close(self) -> list[ShardInfo]:
        return self.writer.close()


def _target(folders: Sequence[Path], fmt: ExportFormat, to_dir: Path | None, split: bool) -> Path:
    """The export folder: ``--to`` or ``OUT/export/<format>``; never a run folder's own data."""
    if to_dir is None and len(folders) > 1:
        raise CosycloneError("several run folders export into one place of your choice: give --to DIR")
    target = Path(to_dir) if to_dir is not None else folders[0] / EXPORT_DIR / fmt
    resolved = target.resolve()
    for out in folders:
        root = out.resolve()
        for own in (root, root / runfolder.WAV_DIR, root / runfolder.STATE_DIR):
            if resolved == own or (own != root and own in resolved.parents):
                raise CosycloneError(f"--to {target}: the export would mix with the run folder's own files; "
                                     f"give a folder of its own (default {out / EXPORT_DIR / fmt})")
        if split and root in resolved.parents:
            raise CosycloneError(f"--split names files after their splits (train-..., validation-...), which "
                                 f"load_dataset('audiofolder', data_dir={out}) would take for {out}'s own "
                                 "splits: give --to outside the run folder")
    return target


def _duplicates(sources: Sequence[Source]) -> None:
    """Refuse ids that two folders both hold ok, naming a few."""
    if len(sources) < 2:
        return
    keys = np.concatenate([s.index.hash for s in sources]).view(np.dtype((np.void, 16))).ravel()
    owner = np.concatenate([np.full(s.index.ok_rows, i) for i, s in enumerate(sources)])
    pos = np.concatenate([np.arange(s.index.ok_rows) for s in sources])
    order = np.argsort(keys, kind="stable")
    same = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if same.size == 0:
        return
    named = []
    for k in same[:5].tolist():
        i, j = int(order[k]), int(order[k + 1])
        rec = sources[int(owner[i])].index.record_at(int(pos[i]))
        named.append(
            f"{rec.id if rec else '?'} ({sources[int(owner[i])].folder} and {sources[int(owner[j])].folder})"
        )
    raise CosycloneError(
        f"{same.size} id{'s' if same.size > 1 else ''} in more than one run folder: "
        f"{', '.join(named)}{' ...' if same.size > 5 else ''}; export folders of distinct rows "
        "(the shards of one manifest), or each folder on its own"
    )


def _check(sources: Sequence[Source], only_passed: bool) -> int | None:
    """The one sample rate of the folders' ok rows (None: no ok row); refuse what cannot be exported."""
    for s in sources:
        if s.index.lines_read == 0:
            raise CosycloneError(
                f"{s.folder}: not a run folder (no records in {runfolder.DIAG_NAME} or a journal)"
            )
        if only_passed and s.evals is None:
            raise CosycloneError(
                f"--only-passed keeps the rows eval passed, and {s.folder} has no {EVAL_NAME}: "
                "run cosyclone eval first"
            )
    rates: dict[int, int] = {}
    for s in sources:
        for r, n in s.index.rates().items():
            rates[r] = rates.get(r, 0) + n
    if len(rates) > 1:
        found = ", ".join(f"{r} Hz: {n} row{'' if n == 1 else 's'}" for r, n in sorted(rates.items()))
        where = " and ".join(str(s.folder) for s in sources)
        raise CosycloneError(f"{where} hold{'s' if len(sources) == 1 else ''} rows at several sample rates "
                             f"({found}): a run at another --sample-rate has not redone them all; finish it "
                             "(rerun synth) before exporting")
    _duplicates(sources)
    return next(iter(rates), None)


def _open(folder: Path, meta_keys: MetaKeys, allow_running: bool, stack: contextlib.ExitStack) -> Source:
    if not folder.is_dir():
        raise CosycloneError(f"{folder}: run folder not found")
    writers = live_writers(folder)
    if writers and not allow_running:
        who = ", ".join(f"pid {w.get('pid')} on {w.get('host')}" for w in writers)
        raise CosycloneError(
            f"{folder} is being written by a cosyclone synth ({who}): export it when the run "
            "ends, or give --allow-running to export the rows finished so far"
        )
    index = RecordIndex(folder, meta_keys)
    stack.callback(index.close)
    evals = EvalIndex(folder) if scores_path(folder).is_file() else None
    if evals is not None:
        stack.callback(evals.close)
    return Source(folder=folder, index=index, evals=evals, writers=len(writers))


def export(
    out_dirs: Path | str | Sequence[Path | str],
    *,
    fmt: ExportFormat = "parquet",
    shard_size_bytes: int = DEFAULT_SHARD_BYTES,
    to_dir: Path | str | None = None,
    only_passed: bool = False,
    rows_per_shard: int | None = None,
    splits: Sequence[str] | None = None,
    include_prompt_audio: bool = False,
    allow_running: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> ExportSummary:
    """Write the ok rows of the run folders ``out_dirs`` as ``fmt``; ``log`` gets a line per file.

    Raises :class:`CosycloneError` for unusable input (not a run folder, a bad option, rows at
    several sample rates, duplicate ids, ``only_passed`` without scores.jsonl, a folder being
    written), :class:`NothingToExport` when no row qualifies,
    :class:`~cosyclone.export.lock.ExportBusy` when another export holds the target and
    :class:`~cosyclone.folder.layout.OutputFolderError` when the export cannot be written. In every
    one of these cases the target keeps what it held.
    """
    folders = [Path(out_dirs)] if isinstance(out_dirs, (str, Path)) else [Path(p) for p in out_dirs]
    if not folders:
        raise CosycloneError("give at least one run folder to export")
    if fmt not in FORMATS:
        raise CosycloneError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if isinstance(shard_size_bytes, bool) or not isinstance(shard_size_bytes, int) or shard_size_bytes < 1:
        raise CosycloneError(f"--shard-size must be at least 1 byte, not {shard_size_bytes!r}")
    if rows_per_shard is not None and rows_per_shard < 1:
        raise CosycloneError(f"--rows-per-shard must be at least 1, not {rows_per_shard}")
    if include_prompt_audio and fmt not in shards.EXTENSIONS:
        raise CosycloneError(
            f"--include-prompt-audio embeds the prompt in Parquet or WebDataset shards; a {fmt} "
            "manifest names it by its path (the prompt_audio field)"
        )
    if len({f.resolve() for f in folders}) < len(folders):
        raise CosycloneError("a run folder is given twice")
    parts = parse_splits(list(splits) if splits else None)
    target = _target(folders, fmt, Path(to_dir) if to_dir is not None else None, bool(parts))
    meta_keys = MetaKeys(RESERVED | NEMO_LOADER_KEYS if fmt == "nemo" else RESERVED)
    with contextlib.ExitStack() as stack:
        sources = [_open(f, meta_keys, allow_running, stack) for f in folders]
        rate = _check(sources, only_passed)
        with_eval = any(s.evals is not None for s in sources)
        backends = tuple(sorted({b for s in sources if s.evals is not None for b in s.evals.backends}))
        cols = ColumnSet.build(meta_keys.columns(), backends if with_eval else None)
        if to_dir is None:  # OUT/export/: the one folder an export makes beside its own
            with contextlib.suppress(OSError):
                target.parent.mkdir(exist_ok=True)
        with ExportTarget(target) as place:
            layout = _Layout(fmt=fmt, cols=cols, backends=backends if with_eval else None,
                             rate=rate or MODEL_RATE, limit=shard_size_bytes, rows_per_shard=rows_per_shard,
                             parts=parts, only_passed=only_passed, prompt=include_prompt_audio, log=log)
            return _write(place, sources, layout)


@dataclass(frozen=True)
class _Layout:
    """How an export's rows are written: the choices every part of :func:`_write` shares."""

    fmt: ExportFormat  # the format
    cols: ColumnSet  # the columns every row carries
    backends: tuple[str, ...] | None  # eval's speaker backends (None: no eval columns)
    rate: int  # the rows' sample rate
    limit: int  # bytes per shard
    rows_per_shard: int | None  # rows per shard (None: by bytes alone)
    parts: tuple[tuple[str, float], ...]  # the --split NAME=F shares (empty: one split)
    only_passed: bool  # only the rows eval passed
    prompt: bool  # the prompt recordings embedded
    log: Callable[[str], None]  # where the notes go

    def sink(self, staging: Path, split: str) -> Sink:
        """Where split ``split``'s rows go: a manifest (NeMo, Lhotse) or shards (Parquet, WebDataset)."""
        if self.fmt == "nemo":
            return NemoManifest(staging, split, self.cols, self.log)
        if self.fmt == "lhotse":
            return LhotseManifests(staging, split, self.cols, self.log)
        writer = shards.ShardWriter(staging, self.fmt, split, self.limit, self.rows_per_shard, self.shard,
                                    self.log)
        return _Shards(writer)

    def shard(self, path: Path) -> shards.Shard:
        if self.fmt == "parquet":
            return shards.ParquetShard(path, sample_rate=self.rate, cols=self.cols, prompt=self.prompt)
        return shards.TarShard(path, self.cols)


@dataclass
class _Written:
    """What the rows' pass wrote, as the card, the marker and the summary count it."""

    counts: dict[str, int]  # split -> rows
    per_source: list[int] = field(default_factory=list)  # rows exported of each source folder, in order
    suffixes: dict[str, str] = field(default_factory=dict)  # the first row's audio and prompt suffixes
    runs_of: dict[Path, set[str | None]] = field(default_factory=dict)  # folder -> the runs of its rows
    shards: list[ShardInfo] = field(default_factory=list)  # the files written, once the sinks are closed


def _write(place: ExportTarget, sources: Sequence[Source], layout: _Layout) -> ExportSummary:
    names = [n for n, _ in layout.parts] + ["train"] if layout.parts else [shards.SHARD_PREFIX]
    sinks: dict[str, Sink] = {}
    skipped, out = Skipped(), _Written(counts=dict.fromkeys(names, 0))
    try:
        for src in sources:
            out.per_source.append(_pass(src, layout, place.staging, sinks, skipped, out))
        rows = sum(out.counts.values())
        if rows == 0:
            raise NothingToExport(
                f"no row of {' '.join(str(s.folder) for s in sources)} can be exported "
                f"({', '.join(f'{k} {v}' for k, v in skipped.counts.items() if v) or 'no ok row'})"
                f"; {place.target} keeps what it held"
            )
        out.shards = [info for name in names if name in sinks for info in sinks.pop(name).close()]
        makers = made_by(out.runs_of)
        if layout.fmt in shards.EXTENSIONS:
            _write_card(place.staging, layout, names, out, makers)
    except BaseException as exc:
        for s in sinks.values():
            with contextlib.suppress(Exception):
                s.abandon()
        if isinstance(exc, OSError):  # a manifest or the card could not be written
            raise runfolder.OutputFolderError(f"cannot write the export in {place.staging}: "
                                              f"{exc.strerror or exc}") from exc
        raise
    records = sum(s.index.rows for s in sources)
    place.commit(_marker(layout, sources, out, skipped, records, makers))
    return ExportSummary(
        format=layout.fmt,
        to_dir=place.target,
        sample_rate=layout.rate,
        records=records,
        rows=rows,
        shards=tuple(ShardInfo(place.target / i.path.name, i.rows, i.bytes, i.split) for i in out.shards),
        skipped=dict(skipped.counts),
        eval_columns=layout.backends is not None,
        splits={k: v for k, v in out.counts.items() if v} if layout.parts else {},
        corrupt=tuple(line for s in sources for line in s.index.corrupt),
        empty_splits=tuple(k for k, v in out.counts.items() if layout.parts and not v),
    )


def _pass(src: Source, layout: _Layout, staging: Path, sinks: dict[str, Sink], skipped: Skipped,
          out: _Written) -> int:
    """One source folder's rows into their splits' sinks (opened as a split's first row comes); its
    skipped rows noted. Returns the rows exported."""
    for where in src.index.corrupt:
        skipped.add(str(src.folder), "", CORRUPT_RECORD, where)
    for row_id, reason in src.index.failed():
        skipped.add(str(src.folder), row_id, "failed", reason)
    done = 0
    for row in iter_rows(src, layout.cols, layout.backends, only_passed=layout.only_passed,
                         prompt=layout.prompt, skipped=skipped):
        split = split_of(row.row_id, layout.parts)
        if split not in sinks:
            sinks[split] = layout.sink(staging, split)
        sinks[split].add(row)
        out.suffixes.setdefault("audio", row.audio.suffix)
        if row.prompt is not None:
            out.suffixes.setdefault("prompt", row.prompt.suffix)
        out.counts[split] += 1
        done += 1
        out.runs_of.setdefault(src.folder, set()).add(row.columns.get("run_id"))
    return done


def _write_card(staging: Path, layout: _Layout, names: list[str], out: _Written,
                makers: list[dict[str, Any]]) -> None:
    """The dataset card of a sharded export (its columns, splits, sizes and what made the rows)."""
    text = card(
        layout.cols,
        layout.fmt,
        sample_rate=layout.rate,
        audio_ext=out.suffixes["audio"],
        prompt_ext=out.suffixes.get("prompt"),
        splits=[n for n in names if out.counts[n]],
        rows={k: v for k, v in out.counts.items() if v},
        sizes={n: sum(i.bytes for i in out.shards if i.split == n) for n in names},
        makers=makers,
    )
    runfolder.write_bytes_atomic(staging / CARD, text.encode())


def _marker(layout: _Layout, sources: Sequence[Source], out: _Written, skipped: Skipped, records: int,
            makers: list[dict[str, Any]]) -> dict[str, Any]:
    """``export.json``: what the export holds and where each of its rows came from."""
    return {
        "format": layout.fmt,
        "rows": sum(out.counts.values()),
        "records": records,
        "sample_rate": layout.rate,
        "created_at": time.time(),
        "splits": {k: v for k, v in out.counts.items() if v} if layout.parts else {},
        "shards": [
            {"file": i.path.name, "split": i.split, "rows": i.rows, "bytes": i.bytes} for i in out.shards
        ],
        "columns": [{"name": c.name, "type": c.type} for c in layout.cols.columns],
        "sources": [
            {
                "folder": str(s.folder.resolve()),
                "state": "running" if s.writers else "idle",
                "records": s.index.rows,
                "ok": s.index.ok_rows,
                "exported": n,
                "eval": s.evals is not None,
            }
            for s, n in zip(sources, out.per_source, strict=True)
        ],
        "skipped": skipped.rows,
        "made_by": makers,  # what made the rows (the card's provenance; NeMo and Lhotse have no card)
        "pid": os.getpid(),
    }
