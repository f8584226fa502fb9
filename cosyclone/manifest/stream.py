"""A manifest read as a stream: lines in chunks, each chunk's texts normalized ahead on every core.

Reading the whole file, splitting it and normalizing every text on one core before saying anything
costs some 3 ms a row (wetext is most of it) before the first row is checked. Here the file is
read line by line (:func:`iter_lines`) and validated in chunks of :data:`CHUNK_LINES` lines
(:func:`warmed_chunks`): while one chunk is checked in this process, the texts of the next are
looked up in the content cache (:mod:`cosyclone.manifest.text_cache`) and the ones missing are normalized
by a process pool (:mod:`cosyclone.manifest.text_pool`). The checks themselves are unchanged
(:func:`cosyclone.manifest.rows.parse_row` runs on every row as before): the normalizer just finds the
chunk's results ready (``TextNormalizer.overlay``), so every error, row and message is what the
one-by-one pass gives, naming the same manifest line. When only validity is wanted (a dry run)
the warmer takes only the texts validation cannot judge unnormalized (``every=False``): for
ordinary texts, none, and no pool is started.

Memory: the file is never held whole; what stays is the rows and errors themselves. A prompt file
shared by many rows is checked once (:class:`AudioChecks`, by path and ``stat``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

from cosyclone.options import TextFrontendName

CHUNK_LINES = 2048  # lines validated together: a few seconds of wetext on two cores for short rows

Decoded = list[tuple[int, Any]]  # (line number, decoded object or the line's error)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of every non-blank line, read as a stream; the same lines as
    splitting the whole file at ``\\n`` (a ``\\r`` before it dropped, a UTF-8 byte-order mark at the start
    dropped)."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            if raw.strip():
                yield number, raw


def decoded_chunks(numbered: Iterable[tuple[int, Any]], decode: Callable[[Any], Any] | None,
                   refusal: type[Exception] = ValueError, size: int | None = None) -> Iterator[Decoded]:
    """``numbered`` in chunks of ``size``, each item decoded by ``decode``; a line ``decode`` refuses
    (raising ``refusal``) keeps that exception in its place, to be reported in order."""
    size = size or CHUNK_LINES
    chunk: Decoded = []
    for number, raw in numbered:
        if decode is None:
            chunk.append((number, raw))
        else:
            try:
                chunk.append((number, decode(raw)))
            except refusal as exc:  # the line's own error (manifest_lines.LineError)
                chunk.append((number, exc))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def speech_bodies(objs: Iterable[Any], *, every: bool = True) -> list[str]:
    """The texts to normalize for these decoded rows (``text_problem``'s ``speakable`` body): with
    ``every``, each one the run's frontend will read; without, only those validation itself must
    normalize to judge (not :func:`~cosyclone.frontend.text_rules.evidently_speakable`)."""
    from cosyclone.frontend.text import MODES, target_parts
    from cosyclone.frontend.text_rules import evidently_speakable, has_markup

    out: dict[str, None] = {}
    for obj in objs:
        if not isinstance(obj, dict):
            continue
        text, mode = obj.get("text"), obj.get("mode", "zero_shot")
        if not isinstance(text, str) or mode not in MODES or not text.strip():
            continue
        try:
            _, body = target_parts(mode, text)
        except Exception:  # the row's error, found again by parse_row
            continue
        if body.strip() and not has_markup(body) and (every or not evidently_speakable(body)):
            out[body] = None
    return list(out)


class TextWarmer:
    """Each chunk's texts found in the cache or normalized by the pool before the chunk is checked.

    ``every``: normalize every text ahead, for the run's frontend, which reads them next (a run,
    ``validate --show-text``). Without it only the texts validation cannot judge unnormalized
    (``--dry-run``, a plain ``validate``): for a manifest of ordinary texts that is none, and neither
    the cache nor the pool is touched.
    """

    def __init__(
        self,
        kind: TextFrontendName,
        *,
        workers: int | None = None,
        min_pool_texts: int | None = None,
        every: bool = True,
    ) -> None:
        from cosyclone.frontend.normalize import get_normalizer
        from cosyclone.manifest.text_cache import text_cache_for
        from cosyclone.manifest.text_pool import MIN_POOL_TEXTS, NormalizePool

        self.normalizer = get_normalizer(kind)
        self.cache = text_cache_for(self.normalizer)
        self.pool = NormalizePool(kind, workers)
        self.min_pool_texts = MIN_POOL_TEXTS if min_pool_texts is None else min_pool_texts
        self.every = every
        self.normalized = 0  # texts this warmer normalized (pool or here): cache misses
        self.normalizer.store = self.cache  # the frontend's later pass finds the texts there too

    def prepare(self, chunk: Decoded) -> tuple[dict[str, tuple[str, str]], list[str], list[Any]]:
        """Look the chunk's texts up and start normalizing the rest (returns a handle for :meth:`finish`)."""
        bodies = speech_bodies((obj for _, obj in chunk), every=self.every)
        found = self.cache.get_many(bodies) if self.cache is not None and bodies else {}
        missing = [b for b in bodies if b not in found]
        futures = (
            self.pool.submit(missing) if len(missing) >= self.min_pool_texts and self.pool.workers > 1 else []
        )
        return found, missing, futures

    def finish(
        self, handle: tuple[dict[str, tuple[str, str]], list[str], list[Any]]
    ) -> dict[str, tuple[str, str]]:
        """The chunk's results: cached, from the pool, and the rest normalized here (then stored)."""
        from cosyclone.manifest.text_pool import normalize_serial

        found, missing, futures = handle
        made = self.pool.gather(futures)
        made.update(normalize_serial(self.normalizer, [t for t in missing if t not in made]))
        self.normalized += len(made)
        if self.cache is not None:
            self.cache.put_many((t, n, lang) for t, (n, lang) in made.items())
        else:  # no cache: keep them in the normalizer's memo, as before, for the frontend's pass
            self.normalizer.remember(made)
        return {**found, **made}

    def close(self) -> None:
        self.normalizer.overlay = {}
        self.pool.close()


def warmed_chunks(chunks: Iterable[Decoded], warmer: TextWarmer | None) -> Generator[Decoded, None, None]:
    """``chunks`` in order, each with its texts ready in the normalizer (``overlay``) while it is
    checked; the next chunk's texts are already being normalized meanwhile."""
    if warmer is None:
        yield from chunks
        return
    pending: deque[tuple[Decoded, Any]] = deque()
    try:
        for chunk in chunks:
            pending.append((chunk, warmer.prepare(chunk)))
            if len(pending) > 1:
                yield _activate(warmer, *pending.popleft())
        while pending:
            yield _activate(warmer, *pending.popleft())
    finally:
        warmer.close()


def _activate(warmer: TextWarmer, chunk: Decoded, handle: Any) -> Decoded:
    warmer.normalizer.overlay = warmer.finish(handle)
    return chunk


class AudioChecks:
    """``check(path)`` memoized by path and its ``stat`` (device, inode, size, mtime, mode): a prompt
    shared by 100,000 rows is opened once; a file changed or replaced meanwhile is checked again."""

    def __init__(self, check: Callable[[Path], tuple[str | None, float]]) -> None:
        self.check = check
        self._memo: dict[str, tuple[tuple[int, ...], tuple[str | None, float]]] = {}

    def __call__(self, path: Path) -> tuple[str | None, float]:
        try:
            st = os.stat(path)
        except (OSError, ValueError):  # missing, a name the file system refuses: the check says why
            return self.check(path)
        sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        key = str(path)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1]
        result = self.check(path)
        self._memo[key] = (sig, result)
        return result
