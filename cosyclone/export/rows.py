"""The rows an export takes from a run folder, one file read at a time, and why the others stay out.

A row is exported when its current record (:mod:`cosyclone.folder.record_scan`) says ``ok`` and its
audio file exists with the recorded samples and rate (read from the file itself). Its columns are
read through :mod:`cosyclone.folder.columns`; where ``scores.jsonl`` exists its verdicts join them, and
a verdict counts only for the very file it scored (``wav_sha256``): a row redone after eval reads
``eval_status`` ``stale`` and has no scores.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError
from cosyclone.export.index import EvalIndex
from cosyclone.export.shards import SHARD_PREFIX, Blob, ExportRow
from cosyclone.folder import layout as runfolder
from cosyclone.folder.audio_out import MODEL_RATE
from cosyclone.folder.checked_read import PROMPT_CAP, NotARegularFile, audio_cap, read_checked
from cosyclone.folder.columns import ColumnSet, RowView, similarity_column
from cosyclone.folder.record_scan import RecordIndex

# Why a row with a record was not exported (ExportSummary.skipped, export.json's "skipped")
FAILED = "failed"  # its current record does not say ok
AUDIO_MISSING = "audio_missing"  # ok, but its audio file is not there (or cannot be read)
# the file is unreadable or holds other samples or another rate than recorded
AUDIO_MISMATCH = "audio_mismatch"
NOT_PASSED = "not_passed"  # only_passed, and eval did not pass this very file
PROMPT_MISSING = "prompt_missing"  # --include-prompt-audio, and its prompt recording cannot be read
# --include-prompt-audio, and the prompt file is not the one the row was made from (its hash differs from the
# fingerprint's, none was recorded, or it is not a regular file)
PROMPT_MISMATCH = "prompt_mismatch"
CORRUPT_RECORD = "corrupt_record"  # a line of diagnostics.jsonl that is not a record (named by line and byte)
REASONS = (FAILED, AUDIO_MISSING, AUDIO_MISMATCH, NOT_PASSED, PROMPT_MISSING, PROMPT_MISMATCH, CORRUPT_RECORD)

_SPLIT = re.compile(r"^([a-z][a-z0-9_]{0,31})=([0-9]*\.?[0-9]+)$")


@dataclass
class Skipped:
    """The rows left out: a count per reason, and each one's folder, id and reason."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    rows: list[dict[str, str]] = field(default_factory=list)

    def add(self, folder: str, row_id: str, reason: str, detail: str | None = None) -> None:
        self.counts[reason] += 1
        entry = {"folder": folder, "id": row_id, "reason": reason}
        if detail:
            entry["detail"] = detail
        self.rows.append(entry)


def parse_splits(specs: list[str] | tuple[str, ...] | None) -> tuple[tuple[str, float], ...]:
    """``["validation=0.02"]`` -> ``(("validation", 0.02),)``; the rest of the rows is ``train``."""
    out: list[tuple[str, float]] = []
    for spec in specs or ():
        m = _SPLIT.match(spec.strip())
        if m is None or m.group(1) in ("train", SHARD_PREFIX) or m.group(1) in dict(out):
            raise CosycloneError(f"--split must be NAME=FRACTION with a new lowercase NAME other than train "
                                 f"(the rest of the rows), such as validation=0.02, not {spec!r}")
        share = float(m.group(2))
        if not 0.0 < share < 1.0:
            raise CosycloneError(f"--split {spec}: the fraction must lie between 0 and 1")
        out.append((m.group(1), share))
    if sum(s for _, s in out) >= 1.0:
        raise CosycloneError(f"--split: the fractions add up to {sum(s for _, s in out):g}; they must leave "
                             "some rows for train")
    return tuple(out)


def split_of(row_id: str, splits: tuple[tuple[str, float], ...]) -> str:
    """The split of a row: a hash of its id against the splits' shares (the same on every rerun)."""
    if not splits:
        return SHARD_PREFIX
    digest = hashlib.blake2b(
        row_id.encode("utf-8", "surrogatepass"), digest_size=8, person=b"cosyclone-split"
    )
    u, edge = int.from_bytes(digest.digest(), "little") / 2.0**64, 0.0
    for name, share in splits:
        edge += share
        if u < edge:
            return name
    return "train"


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def eval_values(ev: dict[str, Any] | None, audio_sha256: str, backends: tuple[str, ...]) -> dict[str, Any]:
    """A row's eval columns: its verdict when eval scored this very file, else ``missing``/``stale`` and
    nulls."""
    status = (
        "missing"
        if ev is None
        else "stale"
        if ev.get("wav_sha256") != audio_sha256
        else str(ev.get("status"))
    )
    fresh: dict[str, Any] = ev if ev is not None and status != "stale" else {}
    fails = fresh.get("fails")
    fails = fails if isinstance(fails, dict) else {}
    sims = fresh.get("speaker_similarity")
    sims = sims if isinstance(sims, dict) else {}
    out: dict[str, Any] = {
        "eval_status": status, "eval_passed": status == "ok" and not fails,
        "eval_fails": sorted(fails) if fresh else None, "eval_metric": _text(fresh.get("metric")),
        "eval_transcript": _text(fresh.get("transcript")),
        "eval_rate_outlier": _text(fresh.get("rate_outlier"))}
    for name in ("error_rate", "wer", "cer", "lead_silence_s", "trail_silence_s", "clipped_fraction",
                 "dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak", "dnsmos_p808", "s_per_char"):
        out[f"eval_{name}"] = _float(fresh.get(name))
    for b in backends:
        out[similarity_column(b)] = _float(sims.get(b))
    return out


def _audio_facts(data: bytes) -> tuple[int, int] | None:
    """(frames, sample rate) of an audio file's bytes, None when they are not a readable file."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
        return int(info.frames), int(info.samplerate)
    except Exception:  # torn, empty or not audio: the row is not done
        return None


@dataclass(frozen=True)
class Source:
    """One run folder an export reads."""

    folder: Path  # as given
    index: RecordIndex  # where its records lie
    evals: EvalIndex | None  # its scores.jsonl (an older eval.jsonl), when it has one
    writers: int  # live synth processes writing it when the export began


def iter_rows(src: Source, cols: ColumnSet, backends: tuple[str, ...] | None, *, only_passed: bool,
              prompt: bool, skipped: Skipped) -> Iterator[ExportRow]:
    """The exportable rows of a folder, manifest order, one file read at a time; ``skipped`` gets the
    others."""
    name = str(src.folder)
    for rec, raw in src.index.records():
        path = runfolder.audio_path(src.folder, rec)
        try:
            if path is None:
                raise FileNotFoundError(rec.id)
            data = read_checked(path, audio_cap(rec.samples))
        except NotARegularFile as exc:  # a FIFO, a device, a link: never read as this row's audio
            skipped.add(name, rec.id, AUDIO_MISMATCH, f"{path}: {exc.strerror}")
            continue
        except OSError:  # not there (or not readable): the row is not done
            skipped.add(name, rec.id, AUDIO_MISSING)
            continue
        facts = _audio_facts(data)
        rate = rec.sample_rate or MODEL_RATE  # records before --sample-rate were all 24 kHz
        # none: the file's
        samples = rec.samples if rec.samples is not None else (facts[0] if facts else None)
        if facts is None or facts[1] != rate or samples != facts[0]:
            skipped.add(name, rec.id, AUDIO_MISMATCH)
            continue
        computed: dict[str, Any] = {}
        if backends is not None:  # eval's columns (a folder without scores.jsonl: missing)
            ev = src.evals.get(rec.id) if src.evals is not None else None
            computed = eval_values(ev, hashlib.sha256(data).hexdigest(), backends)
            if only_passed and not computed["eval_passed"]:
                skipped.add(name, rec.id, NOT_PASSED)
                continue
        blob = None
        if prompt:
            got = prompt_blob(rec.prompt_audio, rec.fingerprint_parts)
            if isinstance(got, tuple):
                skipped.add(name, rec.id, *got)
                continue
            blob = got
        view = RowView(record=rec, raw=raw, samples=facts[0], sample_rate=rate, folder=name)
        yield ExportRow(
            row_id=rec.id,
            audio=Blob(data=data, name=path.name),
            columns=cols.values(view, computed),
            prompt=blob,
            file=path.resolve(),
        )


def prompt_blob(recorded: str, parts: dict[str, str] | None) -> Blob | tuple[str, str]:
    """The prompt recording a row was made from, or (reason, detail) why it is not embedded.

    Why the hash: the path is the one the run read, but the file there now may be another (swapped, or a
    link to a private file in a folder received from someone else); the row's fingerprint holds the
    prompt file's sha256 prefix, and only a file with that prefix is the row's prompt."""
    want = (parts or {}).get("prompt_audio")
    where = Path(recorded)
    try:
        data = read_checked(where, PROMPT_CAP, follow=True)
    except NotARegularFile as exc:
        return PROMPT_MISMATCH, f"{recorded}: {exc.strerror}"
    except OSError as exc:
        return PROMPT_MISSING, f"{recorded}: {exc.strerror or exc}"
    if not isinstance(want, str) or not want:
        return PROMPT_MISMATCH, f"{recorded}: the record holds no prompt hash to check the file against"
    if not hashlib.sha256(data).hexdigest().startswith(want):
        return PROMPT_MISMATCH, f"{recorded}: not the file the row was made from (its sha256 differs)"
    return Blob(data=data, name=where.name)
