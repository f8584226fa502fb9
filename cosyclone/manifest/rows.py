"""The manifest: one JSON object per line, validated before any model work.

Validation is per line: a bad line becomes a :class:`~cosyclone.errors.ManifestError` naming its
1-based line (and field, or key), and is skipped, while good rows still run. Each line is read on
its own: a line that is not UTF-8, not JSON, nested too deep, an object with a duplicate key, an
integer too long to be a seed, or any value a check trips on is that line's error. Only a file
that cannot be read at all (missing, a directory) is "unusable input" for the whole run.

Text fields (``id``, ``text``, ``prompt_text``, ``instruct``, and the ``prompt_audio`` path) refuse
lone surrogates, NUL and other C0/C1 control characters, and the bidi embedding, override and
isolate controls (:func:`text_field_problem`; docs/text_frontend.md says why, and which invisible
marks are kept). The whitespace people type or paste (tab, newline, CR, vertical tab, form feed)
is kept in the spoken fields, which the frontend reads as the official one does.

Schema (docs/manifest.md): ``id`` (safe file name), ``prompt_audio`` (path relative to the manifest's folder),
``text``; optional ``mode`` (zero_shot | cross_lingual | instruct2), ``prompt_text`` (the prompt's transcript:
required for zero_shot, the only mode whose LLM reads it; ignored otherwise, as officially), ``instruct``
(required for instruct2), ``seed`` (int), ``speed`` (positive number), ``meta`` (any JSON
object: the user's own fields, such as a speaker or a language, carried into the row's record,
``metadata.jsonl`` and every export; it never changes the audio). Any other field is refused, each
one named, so a typo (``promt_text``) is never silently dropped.

A ``text`` is checked as the model will read it: blank, or nothing left to speak once normalized
(only emoji, only punctuation such as "..."), or a system prefix where the mode has none, is an
error of that row. The normalizer is loaded once per process, and what it produced here is reused
by the frontend (see :mod:`cosyclone.frontend.normalize`). The file is read as a stream and its
texts are normalized a chunk ahead on every core, through a content cache that outlives the run
(:mod:`cosyclone.manifest.stream`, :mod:`cosyclone.manifest.text_cache`); the checks and their errors are
those of one pass over the lines. Validation alone (``normalize_all=False``: a dry run) normalizes
only the texts that do not evidently have speech
(:func:`~cosyclone.frontend.text_rules.evidently_speakable`), with the same answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from cosyclone.base.shard import Shard
from cosyclone.errors import CosycloneError, ManifestError
from cosyclone.manifest.lines import short_repr
from cosyclone.options import MODES, Mode, TextFrontendName

REQUIRED = ("id", "prompt_audio", "text")
OPTIONAL = ("mode", "prompt_text", "instruct", "seed", "speed", "meta")
KNOWN = frozenset(REQUIRED + OPTIONAL)
_UNSAFE_CHARS = ("/", "\\", "\x00", ":")
TEXT_FIELDS = ("id", "text", "prompt_text", "instruct", "prompt_audio")  # checked by text_field_problem
PROMPT_TOKENS_PER_SECOND = 25  # speech tokens per second of prompt audio (the model's token_frame_rate)
SEED_MAX = (1 << 64) - 1  # seeds are unsigned 64-bit: the LEGACY draw's torch.Generator takes 0..2**64-1
#: Bidi controls that reorder how a text displays (embeddings, overrides, isolates): refused. The
#: marks U+200E, U+200F and U+061C are kept (real right-to-left text carries them; see docs/text_frontend.md).
BIDI_CONTROLS = frozenset([*range(0x202A, 0x202F), *range(0x2066, 0x206A)])
#: Controls kept in a field: tab and newline anywhere; in the spoken fields also CR (Windows line ends),
#: vertical tab and form feed, which texts pasted from spreadsheets and editors carry and the official
#: frontend reads (docs/text_frontend.md, "Line ends, tabs and page breaks").
FIELD_WHITESPACE = "\t\n"
SPOKEN_WHITESPACE = "\t\n\r\v\f"
SPOKEN_FIELDS = ("text", "prompt_text", "instruct")
#: Every character text_field_problem may refuse: lone surrogates, C0 controls but tab and newline, DEL and C1
#: controls, BIDI_CONTROLS (a fast first look; the loop decides, with the field's whitespace: a CR in a
#: spoken field is kept). It must refuse nothing the character loop accepts.
_REFUSED = re.compile("[\ud800-\udfff\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


#: A JSON value as a manifest line holds it (what ``meta`` may carry, at any depth the line allows).
JsonValue: TypeAlias = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
#: A row's ``meta`` object: the user's own fields, by name.
Meta: TypeAlias = dict[str, JsonValue]


@dataclass(frozen=True)
class ManifestRow:
    """One validated row of the manifest."""

    line: int  # 1-based line number in the manifest file
    id: str  # unique, safe as a file name (wavs/<id>.wav)
    prompt_audio: Path  # absolute path of the reference recording
    prompt_text: str  # transcript of the reference recording ("" when absent; zero_shot requires it)
    text: str  # text to synthesize (something to speak)
    mode: Mode = "zero_shot"  # how the prompt conditions the model
    instruct: str = ""  # instruction text (instruct2 only)
    seed: int | None = None  # per-row seed; None derives one from the run seed and the id
    speed: float = 1.0  # speaking-rate factor handed to the frontend
    prompt_seconds: float = 0.0  # prompt_audio duration from its header (0.0 when audio was not checked)
    meta: Meta | None = field(default=None, hash=False)  # the row's meta object (None: the row has none)


@dataclass
class Manifest:
    """The result of reading a manifest: the good rows (in file order) and the per-row errors."""

    path: Path  # the manifest file
    rows: list[ManifestRow] = field(default_factory=list)  # valid rows, file order
    errors: list[ManifestError] = field(default_factory=list)  # one per rejected line
    total_lines: int = 0  # non-blank lines seen
    ordinals: dict[int, int] = field(default_factory=dict)  # line number -> 0-based non-blank ordinal

    @property
    def ok(self) -> bool:
        return not self.errors

    def shard(self, shard: Shard) -> Manifest:
        """The rows and errors of ``shard``, split over all non-blank lines (valid or not).

        Splitting by line rather than by valid row keeps the split identical on machines that
        judge a row differently (e.g. a prompt file present on one of them only).
        """
        start, stop = shard.bounds(self.total_lines)
        inside = {line for line, k in self.ordinals.items() if start <= k < stop}
        return Manifest(path=self.path, rows=[r for r in self.rows if r.line in inside],
                        errors=[e for e in self.errors if e.line in inside], total_lines=stop - start,
                        ordinals={line: self.ordinals[line] - start for line in inside})


def text_field_problem(value: str, *, whitespace: str = FIELD_WHITESPACE) -> str | None:
    """Why ``value`` cannot be a manifest text (None when it can): the first character refused.

    Refused: lone surrogates (no UTF-8 form: a fingerprint, a file or a tokenizer cannot take
    them), NUL and every other C0/C1 control character not in ``whitespace`` (invisible, and
    meaningless to the normalizer and the LLM), and the bidi embedding/override/isolate controls
    (:data:`BIDI_CONTROLS`: a text that displays otherwise than the model reads it). The spoken
    fields pass :data:`SPOKEN_WHITESPACE`; a path or an id keeps the stricter default.
    """
    if _REFUSED.search(value) is None:  # the common case, in C; the loop below names the first one refused
        return None
    for i, ch in enumerate(value):
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            what = "a lone surrogate (not a character: the text is not valid Unicode)"
        elif (code < 0x20 and ch not in whitespace) or 0x7F <= code <= 0x9F:
            what = "a control character"
        elif code in BIDI_CONTROLS:
            what = "a bidi control (the text would display otherwise than it is read)"
        else:
            continue
        import unicodedata

        name = unicodedata.name(ch, "")
        return f"holds {what}, U+{code:04X}{' ' + name if name else ''}, at character {i + 1}; remove it"
    return None


def check_id(value: object) -> str | None:
    """Why ``value`` is not a safe row id (None when it is): ids become file names."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > 200:
        return "is longer than 200 bytes"
    if value.strip() == "" or value != value.strip():
        return "must be non-empty without leading/trailing spaces"
    if value in (".", "..") or ".." in value:
        return "must not contain '..'"
    if any(ch in value for ch in _UNSAFE_CHARS):
        return "must not contain path separators ('/', '\\', ':') or NUL"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "must not contain control characters"
    if value.startswith(".") or value.startswith("-"):
        return "must not start with '.' or '-'"
    problem = text_field_problem(value)  # lone surrogates (no UTF-8 form), C1 controls, bidi controls
    if problem:
        return problem
    if len(value.encode("utf-8")) > 200:
        return "is longer than 200 bytes"
    return None


def _check_audio(path: Path) -> tuple[str | None, float]:
    """(why ``path`` cannot serve as prompt audio or None, its duration in seconds from the header)."""
    try:
        return _audio_problem(path)
    except (OSError, ValueError) as exc:  # a name too long for the file system, a path it cannot encode
        return f"cannot use {str(path)[:200]!r} as prompt audio: {type(exc).__name__}: {exc}", 0.0


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # http://, s3://, file://: a URL, not a path


def _audio_problem(path: Path) -> tuple[str | None, float]:
    if path.is_dir():
        return f"{path} is a directory, not an audio file (give the path of a WAV/FLAC/OGG file)", 0.0
    if path.exists() and not path.is_file():
        return (f"{path} is not a regular file (a FIFO, a device or a socket): give the path of a "
                "WAV/FLAC/OGG file"), 0.0
    if not path.is_file():
        why = "a broken symlink" if path.is_symlink() else "file not found"
        return f"{why}: {path}", 0.0
    try:
        import soundfile as sf

        info = sf.info(str(path))
    except Exception as exc:  # libsndfile raises RuntimeError/LibsndfileError/TypeError
        return f"unreadable audio {path}: {exc}", 0.0
    if info.frames <= 0:
        return f"audio has no samples: {path}", 0.0
    from cosyclone.frontend.audio import (  # the frontend's own limits
        MAX_PROMPT_SECONDS,
        MIN_PROMPT_SECONDS,
        MIN_SAMPLE_RATE,
    )

    seconds = float(info.frames) / float(info.samplerate or 1)
    if info.samplerate < MIN_SAMPLE_RATE:
        return (f"{path} is {info.samplerate} Hz; at least {MIN_SAMPLE_RATE} Hz is required (use a wide-band "
                "recording; upsampling telephone audio does not help)"), seconds
    if seconds > MAX_PROMPT_SECONDS:
        return (f"{path} is {seconds:.2f} s; the speech tokenizer accepts at most {MAX_PROMPT_SECONDS:g} s "
                "(trim the prompt)"), seconds
    if seconds < MIN_PROMPT_SECONDS:
        return (f"{path} is {info.frames} samples ({seconds:.3f} s); the frontend needs at least "
                f"{MIN_PROMPT_SECONDS:g} s of speech"), seconds
    return _samples_problem(path), seconds


def _samples_problem(path: Path) -> str | None:
    """Why the prompt's samples cannot be used (NaN or inf, as the frontend refuses them), None when fine."""
    import numpy as np
    import soundfile as sf

    data, _ = sf.read(str(path), dtype="float32", always_2d=True)
    bad = int(data.size - np.isfinite(data).sum())
    return f"{path} holds {bad} NaN/inf samples: the frontend cannot use it" if bad else None


def parse_row(obj: object, *, line: int, base: Path, check_audio: bool = True,
              text_frontend: TextFrontendName | None = "wetext",
              audio_check: Callable[[Path], tuple[str | None, float]] | None = None) -> ManifestRow:
    """Validate one decoded JSON object; raise :class:`ManifestError` naming line and field.

    ``text_frontend`` (wetext | none) normalizes ``text`` to check it has something to speak;
    None skips that check (the other text checks remain). ``audio_check`` replaces the prompt
    file's check (same answers; :class:`~cosyclone.manifest.stream.AudioChecks` memoizes it).
    """
    if not isinstance(obj, dict):
        raise ManifestError("each line must be a JSON object", line=line)
    rid = obj.get("id")
    rid_s = rid if isinstance(rid, str) else None
    unknown = sorted(str(k) for k in set(obj) - KNOWN)  # str: a Python dict may have other keys
    if unknown:
        several = len(unknown) > 1
        names = f"unknown fields {', '.join(short_repr(k) for k in unknown)}" if several else "unknown field"
        raise ManifestError(f"{names} (allowed: {', '.join(sorted(KNOWN))}; a field of your own goes inside "
                            '"meta")', line=line, field=None if several else unknown[0], row_id=rid_s)
    for name in REQUIRED:
        if name not in obj:
            raise ManifestError("required field missing", line=line, field=name, row_id=rid_s)
    why = check_id(rid)
    if why:
        raise ManifestError(f"unsafe id {short_repr(rid)}: {why}", line=line, field="id")
    for name in ("prompt_audio", "prompt_text", "text", "instruct"):
        if name in obj and not isinstance(obj[name], str):
            raise ManifestError("must be a string", line=line, field=name, row_id=rid_s)
        kept = SPOKEN_WHITESPACE if name in SPOKEN_FIELDS else FIELD_WHITESPACE
        problem = text_field_problem(obj[name], whitespace=kept) if name in obj else None
        if problem:
            raise ManifestError(problem, line=line, field=name, row_id=rid_s)
    text = obj["text"]
    if not text.strip():
        raise ManifestError("text is empty or only whitespace", line=line, field="text", row_id=rid_s)
    mode = obj.get("mode", "zero_shot")
    if mode not in MODES:
        raise ManifestError(
            f"mode {short_repr(mode)} is not one of {', '.join(MODES)}", line=line, field="mode", row_id=rid_s
        )
    prompt_text = obj.get("prompt_text", "") or ""
    instruct = obj.get("instruct", "") or ""
    if mode == "instruct2" and not instruct.strip():
        raise ManifestError("instruct2 needs a non-empty instruct", line=line, field="instruct", row_id=rid_s)
    if mode == "zero_shot" and not prompt_text.strip():
        raise ManifestError("zero_shot needs the prompt's transcript", line=line, field="prompt_text",
                            row_id=rid_s)
    problem = _text_problem(mode, text, text_frontend)
    if problem:
        raise ManifestError(problem, line=line, field="text", row_id=rid_s)
    seed = obj.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX
    ):
        raise ManifestError(
            f"seed must be an integer in 0..2**64-1 (0..{SEED_MAX}, unsigned 64-bit)",
            line=line,
            field="seed",
            row_id=rid_s,
        )
    speed = obj.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= float(speed) <= 4.0:
        raise ManifestError("speed must be a number in [0.25, 4]", line=line, field="speed", row_id=rid_s)
    if not obj["prompt_audio"].strip():
        raise ManifestError("prompt_audio is empty", line=line, field="prompt_audio", row_id=rid_s)
    if _URL.match(obj["prompt_audio"].strip()):
        raise ManifestError(f"{short_repr(obj['prompt_audio'])} is a URL: prompts are read from local files; "
                            "download it and give its path", line=line, field="prompt_audio", row_id=rid_s)
    audio = _prompt_path(base, obj["prompt_audio"])
    seconds = 0.0
    if check_audio:
        why, seconds = (audio_check or _check_audio)(audio)
        if why:
            raise ManifestError(why, line=line, field="prompt_audio", row_id=rid_s)
    meta = check_meta(obj["meta"], line=line, row_id=rid_s) if "meta" in obj else None
    assert isinstance(rid, str)  # check_id refused anything else above
    return ManifestRow(line=line, id=rid, prompt_audio=audio, prompt_text=prompt_text, text=text,
                       mode=mode, instruct=instruct, seed=seed, speed=float(speed), prompt_seconds=seconds,
                       meta=meta)


def check_meta(value: object, *, line: int, row_id: str | None) -> Meta:
    """A row's ``meta`` as the folder will keep it: a JSON object whose every value JSON can write as
    UTF-8 (no NaN, no lone surrogate, no Python object), copied so that a caller's later change to its
    dict does not reach the run. Raises :class:`ManifestError` naming the field."""
    import json

    if not isinstance(value, dict):
        raise ManifestError(f"must be a JSON object (such as {{\"speaker\": \"anna\"}}), not "
                            f"{short_repr(value)}", line=line, field="meta", row_id=row_id)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
        copied: Any = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"cannot be written as JSON: {short_repr(str(exc))}", line=line, field="meta",
                            row_id=row_id) from None
    if set(copied) != set(value):  # a key JSON turned into another string (1 and "1", True and "true")
        raise ManifestError("keys must be strings", line=line, field="meta", row_id=row_id)
    meta: Meta = copied
    return meta


# (base, prompt_audio as written) -> its path: one object per prompt file
_PATHS: dict[tuple[Path, str], Path] = {}


def _prompt_path(base: Path, written: str) -> Path:
    """``written`` from ``base`` (``~`` expanded), the same :class:`Path` object for every row that names
    the same file the same way: 200,000 rows of three prompts hold three paths, not 200,000."""
    key = (base, written)
    found = _PATHS.get(key)
    if found is None:
        path = Path(written).expanduser()
        found = path if path.is_absolute() else (base / path)
        if len(_PATHS) >= 4096:
            _PATHS.clear()
        if not written.startswith("~"):  # "~" follows $HOME at each call, as before
            _PATHS[key] = found
    return found


def _text_problem(mode: Mode, text: str, text_frontend: TextFrontendName | None) -> str | None:
    from cosyclone.frontend.text import target_parts, text_problem

    if text_frontend is None:
        try:
            target_parts(mode, text)
        except CosycloneError as exc:
            return str(exc)
        return None
    return text_problem(mode, text, text_frontend=text_frontend)


def id_key(row_id: str) -> str:
    """The file-system identity of an id: NFKC-normalized and case-folded (NFKC again after
    folding, which can denormalize). Ids with equal keys look alike, or are the same file on
    case-insensitive or normalizing file systems (macOS, Windows), so they are duplicates."""
    import unicodedata

    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", row_id).casefold())
