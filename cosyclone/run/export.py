"""``cosyclone export OUT``: a run folder's good rows as training shards (Parquet or WebDataset).

The run folder stays the source of truth: export only reads it (records, audio files, eval.jsonl)
and writes shards elsewhere (by default ``OUT/export/<format>/``, which nothing else reads). A row
is exported when its current record (:mod:`cosyclone.run.export_index`: latest ``finished_at``
across ``diagnostics.jsonl`` and the journals) says ``ok`` and its audio file exists with the
recorded samples and rate, so a run still in progress or killed exports what it finished. Rows go
in manifest-line order. Rerunning export rewrites every shard of its format in the target
directory: a grown folder gives the new set, never old shards beside new ones.

Memory does not grow with the audio: one row's file is read at a time, and a shard buffers at most
a Parquet row group (100 rows) or one tar member. The records are found through the folder's index
(SQLite, on disk); what grows in memory is the eval index, 24 bytes per ``eval.jsonl`` line.

Where ``OUT/eval.jsonl`` exists its verdicts become columns. A verdict counts only for the very
file it scored (``wav_sha256``): a row redone after eval reads ``eval_status`` ``stale`` and has no
scores. ``eval_passed`` is true when eval scored this file and it failed none of the thresholds
given to eval; ``only_passed`` exports those rows alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError
from cosyclone.run import export_shards as shards
from cosyclone.run import folder as runfolder
from cosyclone.run.audio_out import MODEL_RATE
from cosyclone.run.export_index import EVAL_NAME, EvalIndex, RecordIndex
from cosyclone.run.export_shards import ExportFormat, ExportRow, ShardInfo
from cosyclone.run.row_record import RowRecord

EXPORT_DIR = "export"  # OUT/export/<format>/: the default target
DEFAULT_SHARD_SIZE = "500MB"
DEFAULT_SHARD_BYTES = 500 * 10**6
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?(b?)\s*$", re.IGNORECASE)

# Why a row with a record was not exported (ExportSummary.skipped)
FAILED = "failed"  # its current record does not say ok
AUDIO_MISSING = "audio_missing"  # ok, but its audio file is not there (or cannot be read)
AUDIO_MISMATCH = "audio_mismatch"  # the file is unreadable or holds other samples or another rate than recorded
NOT_PASSED = "not_passed"  # only_passed, and eval did not pass this very file


def parse_size(text: str) -> int:
    """Bytes of ``500MB``, ``2GB``, ``100KB``, ``1.5GiB`` or a plain number (KB/MB/GB decimal, KiB/MiB/GiB binary)."""
    m = _SIZE.match(str(text))
    if m is None or (m.group(2) is None and m.group(3)):
        raise CosycloneError(f"--shard-size must be a size such as 500MB, 2GB, 100KB or a number of bytes, "
                             f"not {text!r}")
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if size < 1:
        raise CosycloneError(f"--shard-size must be at least 1 byte, not {text!r}")
    return size


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote and what it left out."""

    format: ExportFormat  # parquet | webdataset
    to_dir: Path  # where the shards are
    sample_rate: int | None  # of every exported file (None: nothing exported)
    rows: int  # rows exported
    shards: tuple[ShardInfo, ...]  # in order
    records: int  # rows the folder has a record for
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows not exported
    eval_columns: bool = False  # eval.jsonl's verdicts are columns

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def describe(self) -> str:
        """One line: rows, shards, size, rate, where, and what was left out."""
        rate = f" at {self.sample_rate} Hz" if self.sample_rate else ""
        left = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items()) if v)
        return (f"exported {self.rows} of {self.records} rows{rate} into {len(self.shards)} {self.format} shard"
                f"{'' if len(self.shards) == 1 else 's'} ({self.bytes} bytes) in {self.to_dir}"
                + (f"; not exported: {left}" if left else ""))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def eval_columns(ev: dict[str, Any] | None, audio_sha256: str, backends: tuple[str, ...]) -> dict[str, Any]:
    """A row's eval columns: its verdict when eval scored this very file, else ``missing``/``stale`` and nulls."""
    status = "missing" if ev is None else "stale" if ev.get("wav_sha256") != audio_sha256 else str(ev.get("status"))
    fresh: dict[str, Any] = ev if ev is not None and status != "stale" else {}
    fails = fresh.get("fails")
    fails = fails if isinstance(fails, dict) else {}
    sims = fresh.get("speaker_similarity")
    sims = sims if isinstance(sims, dict) else {}
    out: dict[str, Any] = {
        "eval_status": status, "eval_passed": status == "ok" and not fails,
        "eval_fails": sorted(fails) if fresh else None, "eval_metric": _text(fresh.get("metric")),
        "eval_transcript": _text(fresh.get("transcript"))}
    for name in ("error_rate", "wer", "cer", "lead_silence_s", "trail_silence_s", "clipped_fraction"):
        out[f"eval_{name}"] = _float(fresh.get(name))
    for b in backends:
        out[shards.similarity_column(b)] = _float(sims.get(b))
    return out


def _base_columns(rec: RowRecord, duration: float) -> dict[str, Any]:
    return {"id": rec.id, "text": rec.text, "prompt_text": rec.prompt_text, "prompt_audio": rec.prompt_audio,
            "mode": rec.mode, "instruct": rec.instruct, "seed": rec.seed, "duration": duration}


def _audio_facts(data: bytes) -> tuple[int, int] | None:
    """(frames, sample rate) of an audio file's bytes, None when they are not a readable file."""
    import soundfile as sf  # type: ignore[import-untyped]

    try:
        info = sf.info(io.BytesIO(data))
        return int(info.frames), int(info.samplerate)
    except Exception:  # torn, empty or not audio: the row is not done
        return None


def iter_rows(out_dir: Path, index: RecordIndex, evals: EvalIndex | None, *, only_passed: bool,
              skipped: dict[str, int]) -> Iterator[ExportRow]:
    """The exportable rows, manifest order, one file read at a time; ``skipped`` counts the others."""
    backends = evals.backends if evals is not None else ()
    for rec in index.records():
        path = runfolder.audio_path(out_dir, rec)
        try:
            if path is None:
                raise FileNotFoundError(rec.id)
            data = path.read_bytes()
        except OSError:  # not there (or not readable): the row is not done
            skipped[AUDIO_MISSING] += 1
            continue
        facts = _audio_facts(data)
        rate = rec.sample_rate or MODEL_RATE  # records before --sample-rate were all 24 kHz
        samples = rec.samples if rec.samples is not None else (facts[0] if facts else None)  # none: the file's
        if facts is None or facts[1] != rate or samples != facts[0]:
            skipped[AUDIO_MISMATCH] += 1
            continue
        cols = _base_columns(rec, facts[0] / float(rate))
        if evals is not None:
            cols.update(eval_columns(evals.get(rec.id), hashlib.sha256(data).hexdigest(), backends))
            if only_passed and not cols["eval_passed"]:
                skipped[NOT_PASSED] += 1
                continue
        yield ExportRow(row_id=rec.id, audio=data, audio_name=path.name, sample_rate=rate, columns=cols)


def _target(out_dir: Path, fmt: ExportFormat, to_dir: Path | None) -> Path:
    """The shard directory: ``--to`` or ``OUT/export/<format>``; never the folder's own data."""
    target = Path(to_dir) if to_dir is not None else out_dir / EXPORT_DIR / fmt
    resolved, root = target.resolve(), out_dir.resolve()
    for own in (root, root / runfolder.WAV_DIR, root / runfolder.STATE_DIR):
        if resolved == own or (own != root and own in resolved.parents):
            raise CosycloneError(f"--to {target}: the shards would mix with the run folder's own files; "
                                 f"give a directory of their own (default {out_dir / EXPORT_DIR / fmt})")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise runfolder.OutputFolderError(f"cannot create {target}: {exc.strerror or exc}") from exc
    return target


def export(out_dir: Path | str, *, fmt: ExportFormat = "parquet", shard_size_bytes: int = DEFAULT_SHARD_BYTES,
           to_dir: Path | None = None, only_passed: bool = False,
           log: Callable[[str], None] = lambda line: None) -> ExportSummary:
    """Write the ok rows of the run folder ``out_dir`` into ``fmt`` shards; ``log`` gets a line per shard.

    Raises :class:`CosycloneError` for unusable input (not a run folder, bad option, rows at several
    sample rates, ``only_passed`` without eval.jsonl) and
    :class:`~cosyclone.run.folder.OutputFolderError` when a shard cannot be written.
    """
    out_dir = Path(out_dir)
    if fmt not in shards.EXTENSIONS:
        raise CosycloneError(f"--format must be one of {', '.join(shards.EXTENSIONS)}, not {fmt!r}")
    if isinstance(shard_size_bytes, bool) or not isinstance(shard_size_bytes, int) or shard_size_bytes < 1:
        raise CosycloneError(f"--shard-size must be at least 1 byte, not {shard_size_bytes!r}")
    if not out_dir.is_dir():
        raise CosycloneError(f"{out_dir}: run folder not found")
    if not runfolder.record_sources(out_dir):  # before an index is made in a folder that is not a run's
        raise CosycloneError(f"{out_dir}: not a run folder (no records in {runfolder.DIAG_NAME} or a journal)")
    with contextlib.ExitStack() as stack:
        index = RecordIndex(out_dir)
        stack.callback(index.close)
        evals = EvalIndex(out_dir) if (out_dir / EVAL_NAME).is_file() else None
        if evals is not None:
            stack.callback(evals.close)
        return _export(out_dir, index, evals, fmt=fmt, shard_size_bytes=shard_size_bytes, to_dir=to_dir,
                       only_passed=only_passed, log=log)


def _export(out_dir: Path, index: RecordIndex, evals: EvalIndex | None, *, fmt: ExportFormat,
            shard_size_bytes: int, to_dir: Path | None, only_passed: bool,
            log: Callable[[str], None]) -> ExportSummary:
    if index.lines_read == 0:
        raise CosycloneError(f"{out_dir}: not a run folder (no records in {runfolder.DIAG_NAME} or a journal)")
    rates = index.rates()
    if len(rates) > 1:
        found = ", ".join(f"{r} Hz: {n} row{'' if n == 1 else 's'}" for r, n in sorted(rates.items()))
        raise CosycloneError(f"{out_dir} holds rows at several sample rates ({found}): a run at another "
                             "--sample-rate has not redone them all; finish it (rerun synth) before exporting")
    if only_passed and evals is None:
        raise CosycloneError(f"--only-passed keeps the rows eval passed, and {out_dir} has no eval.jsonl: "
                             "run cosyclone eval first")
    rate = next(iter(rates), None)
    target = _target(out_dir, fmt, to_dir)
    shards.clear_shards(target, fmt)
    cols = shards.columns(evals.backends if evals is not None else None)

    def make(path: Path) -> shards.Shard:
        if fmt == "parquet":
            return shards.ParquetShard(path, sample_rate=rate or MODEL_RATE, cols=cols)
        return shards.TarShard(path)

    skipped = {FAILED: index.rows - index.ok_rows, AUDIO_MISSING: 0, AUDIO_MISMATCH: 0, NOT_PASSED: 0}
    writer = shards.ShardWriter(target, fmt, shard_size_bytes, make, log)
    rows = 0
    try:
        for row in iter_rows(out_dir, index, evals, only_passed=only_passed, skipped=skipped):
            writer.add(row)
            rows += 1
        written = writer.close()
    except BaseException:
        writer.abandon()  # an interrupted export leaves whole shards only, no temporary
        raise
    if not written:
        log(f"no rows to export: no shard written in {target}")
    return ExportSummary(format=fmt, to_dir=target, sample_rate=rate if rows else None, rows=rows,
                         shards=tuple(written), records=index.rows, skipped=skipped,
                         eval_columns=evals is not None)
