"""The players' sources: a listed row's audio as a compressed ``data:`` URI, or a link relative to the page.

Why Opus at 16 kHz mono: the page travels by ``scp`` to a laptop, so every listed row's output and
prompt ride inside it; Opus keeps speech intelligible at about 3 kB per second (a tenth of FLAC's),
and every browser plays it. Only the first ``MAX_SECONDS`` of a file are embedded: a row that babbled
to the cap can run for minutes, and its first seconds already say so. The listed rows are bounded,
so the page's size is too, however many rows the folder holds.
"""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np

EMBED_RATE = 16000  # Hz of the embedded audio (one of Opus's own rates)
MAX_SECONDS = 30.0  # seconds of a file the page embeds


@dataclass(frozen=True)
class AudioSource:
    """What a player plays: a source for its ``src`` (None: nothing to play) and a note beside it."""

    src: str | None  # a data: URI or a path relative to the page
    note: str  # "" or why it is missing or cut


def embed(path: Path) -> AudioSource:
    """``path`` as an Opus ``data:`` URI (its first MAX_SECONDS, mono, 16 kHz)."""
    import soundfile as sf
    import soxr

    try:
        with sf.SoundFile(str(path)) as fh:
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
    sf.write(buf, mono, EMBED_RATE, format="OGG", subtype="OPUS")
    note = f"first {MAX_SECONDS:g} s of {frames / rate:.1f} s" if frames > MAX_SECONDS * rate else ""
    return AudioSource("data:audio/ogg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), note)


def link(path: Path, page_dir: Path) -> AudioSource:
    """``path`` relative to the page's folder (the page plays it where the folder sits beside it)."""
    if not path.is_file():
        return AudioSource(None, f"{path} is missing")
    rel = Path(os.path.relpath(path.resolve(), page_dir.resolve()))
    return AudioSource(quote(rel.as_posix()), "")


def source(path: Path | None, page_dir: Path, *, link_audio: bool) -> AudioSource:
    """The player source of ``path`` (embedded unless ``link_audio``)."""
    if path is None:
        return AudioSource(None, "no audio file")
    if not path.is_file():
        return AudioSource(None, f"{path} is missing")
    return link(path, page_dir) if link_audio else embed(path)
