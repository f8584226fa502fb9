"""Reading a manifest: a file's lines (streamed, chunk by chunk) or the API's objects, each validated
as a row (:mod:`cosyclone.manifest.rows` holds the schema and the per-field checks) or as that line's error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from cosyclone.errors import CosycloneError, ManifestError
from cosyclone.manifest.lines import LineError, decode_line, short_repr
from cosyclone.manifest.rows import Manifest, _check_audio, id_key, parse_row
from cosyclone.options import TextFrontendName


def read_manifest(
    path: str | Path,
    *,
    check_audio: bool = True,
    text_frontend: TextFrontendName | None = "wetext",
    normalize_all: bool = True,
) -> Manifest:
    """Read and validate a JSONL manifest; per-row problems land in ``Manifest.errors``.

    ``normalize_all``: normalize every text ahead, into the content cache, for the frontend that
    reads the rows next; False when only the rows' validity is wanted (a text evidently speakable is
    then judged without normalizing it: :func:`~cosyclone.frontend.text_rules.evidently_speakable`).
    The rows and errors are the same either way.

    Raises :class:`CosycloneError` only when the file itself is unusable (missing, not UTF-8) or
    the text normalizer ``text_frontend`` cannot be loaded. Duplicate ids (also ids equal after
    NFKC normalization and case folding, :func:`id_key`): the first occurrence is kept, later
    ones are errors naming the first one's line.
    """
    whole, parts = iter_manifest(path, check_audio=check_audio, text_frontend=text_frontend,
                                 normalize_all=normalize_all)
    for _ in parts:
        pass
    return whole


def rows_from_dicts(objs: Sequence[object], *, base: str | Path = ".", check_audio: bool = True,
                    text_frontend: TextFrontendName | None = "wetext") -> Manifest:
    """Validate Python objects as manifest rows (the Python API's way in), exactly as
    :func:`read_manifest` validates a file's lines: item k (0-based) is reported as line k + 1.

    Relative ``prompt_audio`` paths are taken from ``base`` (default: the working directory).
    """
    base = Path(base).expanduser().resolve()
    if text_frontend is not None:
        from cosyclone.frontend.normalize import get_normalizer

        get_normalizer(text_frontend)
    out = Manifest(path=base / "<rows>")
    _collect(out, enumerate(objs, start=1), base=base, check_audio=check_audio, text_frontend=text_frontend,
             as_json=False)
    return out


def _collect(out: Manifest, numbered: Iterable[tuple[int, object]], *, base: Path, check_audio: bool,
             text_frontend: TextFrontendName | None, as_json: bool) -> None:
    """Validate ``(line number, item)`` pairs into ``out`` (rows, errors); items are JSON text
    (``as_json``, a manifest's lines) or already decoded objects (the Python API)."""
    for _ in _collect_parts(out, numbered, base=base, check_audio=check_audio, text_frontend=text_frontend,
                            as_json=as_json):
        pass


def _collect_parts(
    out: Manifest,
    numbered: Iterable[tuple[int, object]],
    *,
    base: Path,
    check_audio: bool,
    text_frontend: TextFrontendName | None,
    as_json: bool,
    normalize_all: bool = True,
) -> Iterator[Manifest]:
    """:func:`_collect`, yielding after each chunk what that chunk added (its rows and errors).

    Chunk by chunk (:mod:`cosyclone.manifest.stream`): each chunk's texts are normalized ahead, on
    every core and through the content cache, while the previous chunk is checked here in order
    (without ``normalize_all``, only the texts validation cannot judge unnormalized).
    """
    from contextlib import closing

    from cosyclone.manifest.stream import AudioChecks, TextWarmer, decoded_chunks, warmed_chunks

    seen: dict[str, tuple[int, str]] = {}  # id_key -> (first line, first id)
    warmer = TextWarmer(text_frontend, every=normalize_all) if text_frontend is not None else None
    audio = AudioChecks(_check_audio)
    with closing(
        warmed_chunks(decoded_chunks(numbered, decode_line if as_json else None, LineError), warmer)
    ) as chunks:
        for chunk in chunks:
            rows, errors = len(out.rows), len(out.errors)
            for number, obj in chunk:
                _collect_one(
                    out,
                    seen,
                    number,
                    obj,
                    base=base,
                    check_audio=check_audio,
                    text_frontend=text_frontend,
                    audio=audio,
                )
            yield Manifest(path=out.path, rows=out.rows[rows:], errors=out.errors[errors:])


def iter_manifest(
    path: str | Path,
    *,
    check_audio: bool = True,
    text_frontend: TextFrontendName | None = "wetext",
    normalize_all: bool = True,
) -> tuple[Manifest, Iterator[Manifest]]:
    """A manifest read as it is validated: (the whole, filling as it goes; its parts, chunk by chunk).

    The same rows, errors and messages as :func:`read_manifest` (which is this, drained), so a run
    can start on the first rows while later lines are still being read and normalized. The file's
    problems (missing, unreadable) raise :class:`CosycloneError` here, before any part.
    ``normalize_all``: as for :func:`read_manifest`.
    """
    path = Path(path).expanduser()
    if text_frontend is not None:
        from cosyclone.frontend.normalize import get_normalizer

        get_normalizer(text_frontend)  # a missing or broken normalizer stops here, before any row
    if not path.is_file():
        raise CosycloneError(f"{path}: manifest not found")
    from cosyclone.manifest.stream import iter_lines

    out = Manifest(path=path)

    def parts() -> Iterator[Manifest]:
        try:  # read as a stream (manifest_stream): the file is never held whole
            yield from _collect_parts(
                out,
                iter_lines(path),
                base=path.resolve().parent,
                check_audio=check_audio,
                text_frontend=text_frontend,
                as_json=True,
                normalize_all=normalize_all,
            )
        except OSError as exc:
            raise CosycloneError(f"{path}: cannot read the manifest: {exc}") from exc

    return out, parts()


def _collect_one(
    out: Manifest,
    seen: dict[str, tuple[int, str]],
    number: int,
    obj: object,
    *,
    base: Path,
    check_audio: bool,
    text_frontend: TextFrontendName | None,
    audio: Callable[[Path], tuple[str | None, float]],
) -> None:
    """One decoded line (or its :class:`LineError`) into ``out``: a row, or the line's error."""
    out.ordinals[number] = out.total_lines
    out.total_lines += 1
    if isinstance(obj, LineError):
        out.errors.append(ManifestError(str(obj), line=number, field=obj.key))
        return
    try:
        row = parse_row(obj, line=number, base=base, check_audio=check_audio, text_frontend=text_frontend,
                        audio_check=audio)
    except ManifestError as exc:
        out.errors.append(exc)
        return
    except Exception as exc:  # a check that tripped on this value: the line's error, never the run's
        out.errors.append(
            ManifestError(
                f"could not be validated ({type(exc).__name__}: {short_repr(str(exc))})", line=number
            )
        )
        return
    key = id_key(row.id)
    if key in seen:
        first_line, first_id = seen[key]
        how = "duplicate id" if first_id == row.id else (
            f"duplicate id: {row.id!r} and {first_id!r} are equal after Unicode normalization (NFKC) and "
            "case folding, so they would be look-alike files here and the same file on macOS and Windows")
        out.errors.append(ManifestError(f"{how} (first used on line {first_line})", line=number,
                                        field="id", row_id=row.id))
        return
    seen[key] = (number, row.id)
    out.rows.append(row)
