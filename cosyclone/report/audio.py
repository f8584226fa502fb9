"""The players' sources: a listed row's audio as a compressed ``data:`` URI, or a link relative to the page.

Why Ogg Vorbis at 16 kHz mono: the page travels by ``scp`` to a laptop, so every listed row's output
and prompt ride inside it; Vorbis keeps speech clear at about 4 kB per second (an eighth of FLAC's),
Chromium and Firefox play it, and libsndfile encodes it about six times faster than Opus (a page lists a
hundred rows or so, and a prompt shared by many of them is encoded once). Only the first
``MAX_SECONDS`` of a file are embedded: a row that babbled to the cap can run for minutes, and its
first seconds already say so. The listed rows are bounded, so the page's size is too, however many
rows the folder holds.

Each file is read as its record allows (:mod:`cosyclone.folder.checked_read`, through the ``read`` the
page passes): a row's audio as a regular file that is no symlink, a prompt only when its bytes are the
prompt the row was made from; anything else gets a note instead of a player, so a swapped path never
puts another file into the page.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

EMBED_RATE = 16000  # Hz of the embedded audio (speech keeps its words; a sixth of 48 kHz's bits)
MAX_SECONDS = 20.0  # seconds of a file the page embeds
QUALITY_LEVEL = 0.9  # libsndfile's Vorbis compression level (1.0: smallest): about 30 kbit/s at 16 kHz


@dataclass(frozen=True)
class AudioSource:
    """What a player plays: a source for its ``src`` (None: nothing to play) and a note beside it."""

    src: str | None  # a data: URI or a path relative to the page
    note: str  # "" or why it is missing or cut


Reader = Callable[[Path], bytes]  # a file's bytes as its record allows (raises OSError with why not)


def embed(path: Path, data: bytes) -> AudioSource:
    """``path``'s bytes ``data`` as an Ogg Vorbis ``data:`` URI (its first MAX_SECONDS, mono, 16 kHz)."""
    import soundfile as sf
    import soxr

    try:
        with sf.SoundFile(io.BytesIO(data)) as fh:
            rate, frames = fh.samplerate, fh.frames
            wave = fh.read(min(frames, int(MAX_SECONDS * rate)), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, sf.LibsndfileError) as exc:
        return AudioSource(None, f"cannot read {path.name}: {exc}")
    mono = np.ascontiguousarray(wave.mean(axis=1), dtype=np.float32)
    if mono.size == 0:
        return AudioSource(None, f"{path.name} holds no samples")
    if rate != EMBED_RATE:
        mono = soxr.resample(mono, rate, EMBED_RATE).astype(np.float32)
    mono = np.nan_to_num(np.clip(mono, -1.0, 1.0))
    buf = io.BytesIO()
    sf.write(buf, mono, EMBED_RATE, format="OGG", subtype="VORBIS", compression_level=QUALITY_LEVEL)
    note = f"first {MAX_SECONDS:g} s of {frames / rate:.1f} s" if frames > MAX_SECONDS * rate else ""
    return AudioSource("data:audio/ogg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), note)


def link(path: Path, page_dir: Path) -> AudioSource:
    """``path`` relative to the page's folder (the page plays it where the folder sits beside it)."""
    if not path.is_file():
        return AudioSource(None, f"{path} is missing")
    rel = Path(os.path.relpath(path.resolve(), page_dir.resolve()))
    return AudioSource(quote(rel.as_posix()), "")


def source(path: Path | None, page_dir: Path, *, link_audio: bool, read: Reader) -> AudioSource:
    """The player source of ``path`` (embedded unless ``link_audio``), read by ``read``."""
    if path is None:
        return AudioSource(None, "no audio file")
    try:
        data = read(path)
    except FileNotFoundError:
        return AudioSource(None, f"{path} is missing")
    except OSError as exc:
        return AudioSource(None, f"{path} is not played: {exc.strerror or exc}")
    return link(path, page_dir) if link_audio else embed(path, data)


def sources(paths: Sequence[tuple[Path | None, Reader]], page_dir: Path, *,
            link_audio: bool) -> list[AudioSource]:
    """:func:`source` of each (path, reader), each distinct file read once, on a thread per core
    (libsndfile's encoder runs outside the GIL)."""
    distinct = list(dict.fromkeys((p, r) for p, r in paths if p is not None))
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        done = dict(
            zip(
                distinct,
                pool.map(lambda pr: source(pr[0], page_dir, link_audio=link_audio, read=pr[1]), distinct),
                strict=True,
            )
        )
    return [done[(p, r)] if p is not None else AudioSource(None, "no audio file") for p, r in paths]
