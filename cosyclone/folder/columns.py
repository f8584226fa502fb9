"""The columns of an export, declared once: name, type, the record field each is read from, meaning.

Why one table: Parquet's schema (and the ``datasets`` features in its metadata), the WebDataset
``<key>.json``, the NeMo manifest's lines, the Lhotse supervisions' ``custom`` fields and the run folder's own
``metadata.jsonl`` (:func:`metadata_line`) all take their fields from :data:`CORE`, :data:`SAMPLER` and
:data:`EVAL` (plus the columns a folder's
content adds: a speaker backend's similarity, a flat ``meta`` key), so a column cannot be in one
format and missing or typed differently in another; docs/output.md lists the same table.

Types: ``uint64`` holds a seed (the manifest takes 0 .. 2^64-1). Parquet stores it as uint64; every
JSON output writes it as a decimal string, because JSON readers that build Arrow tables
(``datasets``' webdataset and json loaders, ``pyarrow.json``) stop at 2^63-1 and a float would
round it. A record is data: a field it lacks (written by an older cosyclone, or before a field
existed) reads as the column's null, never as an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from cosyclone.folder.row_record import RowRecord
from cosyclone.talker.diagnostics import SamplerRowDiagnostics

ColumnType = Literal["string", "int64", "uint64", "float64", "bool", "list<string>"]


@dataclass(frozen=True)
class RowView:
    """What a row's columns are read from: its record as typed, the line as written, its file's facts."""

    record: RowRecord  # the current record
    raw: Mapping[str, Any]  # the same line as JSON (fields this cosyclone's RowRecord may not know yet)
    samples: int  # samples in the audio file as read
    sample_rate: int  # the audio file's rate as read
    folder: str  # the run folder it came from, as given to export


@dataclass(frozen=True)
class Column:
    """One column of every export format."""

    name: str  # the column's name in every format
    type: ColumnType  # its Arrow type (JSON: uint64 as a decimal string)
    source: str  # the record field (or file fact) it is read from
    description: str  # what it means, for docs/output.md
    read: Callable[[RowView], Any]  # its value for a row (None: null)
    stats: bool = True  # Parquet min/max statistics (False for free text: no reader filters on it)


def _get(name: str) -> Callable[[RowView], Any]:
    """A record field: the typed record's, else the line's own (a field this cosyclone does not type)."""
    return lambda v: getattr(v.record, name) if hasattr(v.record, name) else v.raw.get(name)


def coerce(kind: ColumnType, value: Any) -> Any:
    """``value`` as a column of ``kind`` holds it, None when it is not one (a record is data: no
    value it may hold stops an export)."""
    if value is None:
        return None
    if kind == "string":
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind in ("int64", "uint64"):
        low, high = (-(2**63), 2**63) if kind == "int64" else (0, 2**64)
        return (
            value if isinstance(value, int) and not isinstance(value, bool) and low <= value < high else None
        )
    if kind == "float64":
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return [v if isinstance(v, str) else str(v) for v in value] if isinstance(value, (list, tuple)) else None


def stop_reason(view: RowView) -> str | None:
    """The row's stop reason, as its record holds it (derived from its segments' for an older line)."""
    return view.record.stop_reason


def normalized_text(view: RowView) -> str | None:
    """The text the model read, as its record holds it (its segments' texts joined for an older line)."""
    return view.record.normalized_text or None


def meta_of(view: RowView) -> Any:
    """The row's ``meta`` (the manifest's user object), None when it has none; a line's value that is not
    an object (a hand edit) is exported as it is."""
    return view.record.meta if view.record.meta is not None else view.raw.get("meta")


def meta_json(view: RowView) -> str | None:
    meta = meta_of(view)
    return None if meta is None else json.dumps(meta, ensure_ascii=False, sort_keys=True)


CORE: tuple[Column, ...] = (
    Column("id", "string", "id", "the manifest row's id", _get("id")),
    Column("text", "string", "text", "the manifest's text", _get("text"), stats=False),
    Column(
        "normalized_text",
        "string",
        "normalized_text",
        "the text the model read, after normalization",
        normalized_text,
        stats=False,
    ),
    Column(
        "prompt_text", "string", "prompt_text", "the prompt's transcript", _get("prompt_text"), stats=False
    ),
    Column(
        "prompt_audio",
        "string",
        "prompt_audio",
        "the prompt recording's path on the synth machine",
        _get("prompt_audio"),
        stats=False,
    ),
    Column("mode", "string", "mode", "zero_shot | cross_lingual | instruct2", _get("mode")),
    Column("instruct", "string", "instruct", "the instruction (instruct2)", _get("instruct"), stats=False),
    Column("seed", "uint64", "seed", "the row's seed as used (0 .. 2^64-1)", _get("seed")),
    Column("speed", "float64", "speed", "the speaking-rate factor", _get("speed")),
    Column(
        "llm",
        "string",
        "llm",
        "the talker file that made it (llm.pt, llm.rl.pt; dummy: random weights; unrecorded: a row made "
        "before cosyclone recorded its talker)",
        lambda v: v.record.llm or "unrecorded",
    ),
    Column("run_id", "string", "run_id", "the run that made it (the card's provenance, runs.jsonl)",
           _get("run_id")),
    Column(
        "duration",
        "float64",
        "the file",
        "seconds of the audio file (samples / sample_rate)",
        lambda v: v.samples / float(v.sample_rate) if v.sample_rate else None,
    ),
    Column("sample_rate", "int64", "the file", "the audio file's sample rate (Hz)", lambda v: v.sample_rate),
    Column(
        "stop_reason",
        "string",
        "stop_reason",
        "why the talker stopped: eos (its stop token), max_len (the token cap), or an abort",
        stop_reason,
    ),
    Column(
        "stop_reasons",
        "list<string>",
        "stop_reasons",
        "the stop reason per text segment",
        lambda v: list(v.record.stop_reasons),
    ),
    Column(
        "speech_tokens", "int64", "tokens", "speech tokens of all segments", lambda v: sum(v.record.tokens)
    ),
    Column(
        "meta",
        "string",
        "meta",
        "the manifest row's meta object as JSON text (null: none)",
        meta_json,
        stats=False,
    ),
)


def _sampler_total(name: str) -> Callable[[RowView], Any]:
    return lambda v: sum(int(getattr(s, name)) for s in v.record.sampler)


# the sampler's counters summed over a row's segments (what docs/output.md calls the sampler's counters)
SAMPLER: tuple[Column, ...] = tuple(
    Column(f"sampler_{f.name}", "int64", f"sampler[].{f.name}", f"the sampler's {f.name.replace('_', ' ')}, "
           "summed over the segments", _sampler_total(f.name))
    for f in fields(SamplerRowDiagnostics)
    if f.type in ("int", int) and f.name not in ("seed", "segment"))

# scores.jsonl's verdict of the row's very file (values from :func:`eval_columns`)
EVAL: tuple[tuple[str, ColumnType, str], ...] = (
    ("eval_status", "string", "ok / error / skipped; stale: eval scored an earlier file; missing: no line"),
    ("eval_passed", "bool", "eval scored this very file and it failed none of eval's thresholds"),
    ("eval_fails", "list<string>", "the checks it failed"),
    ("eval_metric", "string", "wer or cer"),
    ("eval_error_rate", "float64", "the metric's value"),
    ("eval_wer", "float64", "word error rate"),
    ("eval_cer", "float64", "character error rate"),
    ("eval_transcript", "string", "the ASR transcript"),
    ("eval_lead_silence_s", "float64", "leading silence (s)"),
    ("eval_trail_silence_s", "float64", "trailing silence (s)"),
    ("eval_clipped_fraction", "float64", "share of clipped samples"),
    ("eval_dnsmos_ovrl", "float64", "DNSMOS P.835 overall quality (1..5)"),
    ("eval_dnsmos_sig", "float64", "DNSMOS P.835 speech signal quality (1..5)"),
    ("eval_dnsmos_bak", "float64", "DNSMOS P.835 background noise (1..5, higher: less noise)"),
    ("eval_dnsmos_p808", "float64", "DNSMOS P.808 overall MOS (1..5)"),
    ("eval_s_per_char", "float64", "seconds of speech per character"),
    ("eval_rate_outlier", "string", "slow / fast: the speaking rate lies outside its language's fences"),
)
FREE_TEXT = frozenset({"eval_transcript"})


def _computed(view: RowView) -> Any:
    return None  # eval's values are computed beside the row (ColumnSet.values takes them as given)


def eval_columns(backends: tuple[str, ...]) -> tuple[Column, ...]:
    """eval's columns, a similarity column per speaker backend eval scored with."""
    cols = [Column(n, t, "scores.jsonl", d, _computed, stats=n not in FREE_TEXT) for n, t, d in EVAL]
    cols += [Column(similarity_column(b), "float64", "scores.jsonl", f"speaker similarity ({b})", _computed)
             for b in backends]
    return tuple(cols)


def similarity_column(backend: str) -> str:
    """The column of a speaker backend's similarity (``eval_similarity_campplus``)."""
    return "eval_similarity_" + re.sub(r"[^a-z0-9_]", "_", backend.lower())


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_META_COLUMNS = 32  # flat meta keys made columns (more: meta's JSON text holds them all)


class MetaKeys:
    """The ``meta`` keys that become columns of their own: string values in every row that has them.

    Fed every exported row's meta before the columns are fixed (Parquet's schema is written with
    the first shard); a key whose name would shadow a declared column stays in ``meta`` alone.
    """

    def __init__(self, reserved: frozenset[str]) -> None:
        self.reserved = reserved
        self._keys: dict[str, bool] = {}  # key -> every value a string so far (first-seen order)

    def add(self, meta: Any) -> None:
        if not isinstance(meta, Mapping):
            return
        for key, value in meta.items():
            if not isinstance(key, str) or key in self.reserved or not _IDENT.match(key) \
                    or key.startswith(("eval_", "sampler_")):
                continue
            if key in self._keys or len(self._keys) < 4 * MAX_META_COLUMNS:
                self._keys[key] = self._keys.get(key, True) and isinstance(value, str)

    def columns(self) -> tuple[Column, ...]:
        keys = [k for k, flat in self._keys.items() if flat][:MAX_META_COLUMNS]
        return tuple(Column(k, "string", f"meta.{k}", f"the meta key {k!r} (a string in every row)",
                            _meta_key(k), stats=True) for k in keys)


def _meta_key(key: str) -> Callable[[RowView], Any]:
    def read(view: RowView) -> Any:
        meta = meta_of(view)
        value = meta.get(key) if isinstance(meta, Mapping) else None
        return value if isinstance(value, str) else None
    return read


@dataclass(frozen=True)
class ColumnSet:
    """The columns of one export, in order: core, sampler, the meta keys, eval's (when eval ran)."""

    columns: tuple[Column, ...]

    @classmethod
    def build(cls, meta: tuple[Column, ...], eval_backends: tuple[str, ...] | None) -> ColumnSet:
        evals = eval_columns(eval_backends) if eval_backends is not None else ()
        return cls((*CORE, *SAMPLER, *meta, *evals))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def values(self, view: RowView, computed: Mapping[str, Any]) -> dict[str, Any]:
        """Every column's value for a row, of its type; ``computed`` holds those read elsewhere (eval's)."""
        return {c.name: coerce(c.type, computed[c.name] if c.name in computed else c.read(view))
                for c in self.columns}

    def json_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values as JSON outputs write them (uint64 as decimal strings)."""
        return {c.name: to_json(c, values.get(c.name)) for c in self.columns}


def to_json(column: Column, value: Any) -> Any:
    """A value as the JSON outputs write it: a uint64 as a decimal string, the rest as it is."""
    return str(value) if column.type == "uint64" and value is not None else value


RESERVED = frozenset(c.name for c in (*CORE, *SAMPLER)) | frozenset(n for n, _, _ in EVAL) | frozenset(
    {"audio", "prompt", "sample_rate", "audio_filepath", "split", "__key__", "__url__"})


#: the columns of a run folder's ``metadata.jsonl``: every row's own (no meta key or eval verdict, which
#: depend on the whole folder)
METADATA = ColumnSet((*CORE, *SAMPLER))


def metadata_line(rec: RowRecord, file_name: str | None = None) -> dict[str, Any]:
    """The ``metadata.jsonl`` line of an ``ok`` row: its audio file under the audiofolder convention's
    ``file_name``, then :data:`METADATA`'s columns as the JSON outputs write them, so that
    ``datasets.load_dataset("audiofolder")`` (Arrow's JSON reader: one type per column) gives every
    value back exactly: ``seed`` a decimal string, ``meta`` the JSON text of the row's object,
    ``duration`` the file's own (after --trim-silence) at its ``sample_rate``. The loader takes its
    column types from the first ``wavs/<shard>/metadata.jsonl`` alone, so no column is null in one
    directory and text in another: a row without ``meta`` has the JSON text ``"null"``. ``file_name`` is the
    file relative to the metadata file (the record's ``file``, relative to the folder, when not given)."""
    view = RowView(record=rec, raw={}, samples=rec.samples or 0, sample_rate=rec.sample_rate or 0, folder=".")
    values = METADATA.json_values(METADATA.values(view, {}))
    if values.get("meta") is None:  # JSON text in every line: a directory of rows without meta must not
        values["meta"] = "null"     # read as a null column that the next directory's text cannot cast to
    return {"file_name": file_name if file_name is not None else rec.file, **values}
