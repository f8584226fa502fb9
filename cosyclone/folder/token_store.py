"""Stage-0 checkpoint: each segment's talker result on disk, so a rerun redoes only code2wav.

Why: the talker is the sequential, expensive part of a row on a GPU; when code2wav fails for a row
(out of memory, a killed run between the two stages), the row's speech tokens are already known.
They are stored with the :mod:`cosyclone.base.handoff` serializer (exact bytes, checksummed) under
``OUT/.cosyclone/tokens/<fingerprint>-<segment>.cch``, keyed by the row's fingerprint, so a row whose
inputs changed never reuses them. A row's files are removed once its record is down; the tokens of a
row that failed after the talker stay for the next run. Tokens are a function of the row alone (its
seed and fingerprint), so reusing them gives exactly the tokens a fresh talker run would.

The thread that steps the talker only decodes: :meth:`TokenStore.put` queues the result for the
store's own I/O thread, which writes it without fsync (the store is advisory: a lost or torn file
fails its checksum and only costs a rerun of the talker), and :meth:`TokenStore.get` answers from
what the directory held when the store opened plus what this run put, with no file system call for
a segment that has none. Files are removed by their known names (a row's segments 0, 1, ... until
one is missing), never by listing the directory per row; only :meth:`TokenStore.prune` lists it, once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

import torch

from cosyclone.base import handoff
from cosyclone.base.atomic import write_atomic
from cosyclone.talker import TalkerResult
from cosyclone.talker.diagnostics import STOP_REASONS, SamplerRowDiagnostics, StopReason

_DIAG_FIELDS = {f.name for f in fields(SamplerRowDiagnostics)}


class TokenStore:
    """Talker results by (row id, segment), for the rows whose token keys ``keys`` gives."""

    def __init__(self, root: Path, keys: Mapping[str, str]) -> None:
        self.root = Path(root)
        # row id -> its token key (fingerprint.token_key of the fingerprint parts): the rows in flight and
        # those that failed (a row's entry goes when its record is down ok)
        self.keys = dict(keys)
        self.hits = 0
        self._lock = threading.Lock()
        self._known = _listing(self.root)  # token key -> segments on disk (or queued for it)
        self._queued: dict[tuple[str, int], TalkerResult] = {}  # put, not yet written
        self._io: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="cosyclone-tokens", daemon=True)
        self._thread.start()

    def _path(self, key: str, segment: int) -> Path:
        return self.root / f"{key}-{int(segment)}.cch"

    def add_keys(self, keys: Mapping[str, str]) -> None:
        """The token keys of rows about to run."""
        with self._lock:
            self.keys.update(keys)

    def get(self, row_id: str, segment: int) -> TalkerResult | None:
        """The stored result of this segment, None when there is none (or it does not read back)."""
        with self._lock:
            key = self.keys.get(row_id)
            if key is None or int(segment) not in self._known.get(key, ()):
                return None  # no file system call for a segment the store never had
            queued = self._queued.get((key, int(segment)))
        if queued is not None:
            self.hits += 1
            return queued
        try:
            data = handoff.load(self._path(key, segment))
        except handoff.HandoffError:  # torn, damaged or gone: the talker simply runs again
            return None
        diag = data.get("diagnostics")
        stop = str(data["stop_reason"])
        if stop not in STOP_REASONS:  # written by a version with another vocabulary: the talker runs again
            return None
        self.hits += 1
        return TalkerResult(
            row_id=row_id, tokens=[int(t) for t in data["tokens"].tolist()],
            raw_tokens=[int(t) for t in data["raw_tokens"].tolist()], stop_reason=cast(StopReason, stop),
            diagnostics=None if not diag else SamplerRowDiagnostics(
                **{k: v for k, v in diag.items() if k in _DIAG_FIELDS}),
            min_len=int(data.get("min_len", 0)))

    def put(self, row_id: str, segment: int, res: TalkerResult) -> None:
        """Queue a fresh talker result for the I/O thread; rows without a token key are not stored."""
        with self._lock:
            key = self.keys.get(row_id)
            if key is None:
                return
            self._known.setdefault(key, set()).add(int(segment))
            self._queued[(key, int(segment))] = res
        self._io.put(("put", (key, int(segment), res)))

    def discard(self, row_id: str) -> None:
        """Remove the row's stored segments (its record is down: they are no longer needed)."""
        with self._lock:
            key = self.keys.pop(row_id, None)
            if key is None:
                return
            self._known.pop(key, None)
        self._io.put(("discard", key))

    def discard_done(self, keys: Mapping[str, str]) -> None:
        """Rows already done before this run (``keys``: row id -> token key): any segments an earlier run
        left for them go."""
        with self._lock:
            gone = [key for key in keys.values() if self._known.pop(key, None) is not None]
        for key in gone:
            self._io.put(("discard", key))

    def committed(self, row_id: str, ok: bool) -> None:
        """A row's record is down: an ok row's segments go; a failed row's stay for the next run."""
        if ok:
            self.discard(row_id)

    def prune(self) -> None:
        """Remove stored segments of token keys no row of this run holds (inputs changed since): one
        listing of the directory, on the I/O thread."""
        with self._lock:
            live = set(self.keys.values())
        self._io.put(("prune", live))

    def close(self) -> None:
        """Wait for every queued write and removal; safe to call twice."""
        if self._thread.is_alive():
            self._io.put(None)
            self._thread.join()

    # -- the I/O thread -------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._io.get()
            if item is None:
                return
            what, arg = item
            with contextlib.suppress(OSError):  # a checkpoint that cannot be written or removed costs a rerun
                if what == "put":
                    self._write(*arg)
                elif what == "discard":
                    _unlink_segments(self.root, arg)
                else:
                    self._prune(arg)

    def _write(self, key: str, segment: int, res: TalkerResult) -> None:
        try:
            with self._lock:
                if segment not in self._known.get(key, ()):
                    return  # its row went down ok meanwhile (a thread that lags catches up, not writes it)
            path = self._path(key, segment)
            diag = res.diagnostics.to_dict() if res.diagnostics is not None else None
            payload: dict[str, Any] = {
                "tokens": torch.tensor(res.tokens, dtype=torch.long), "stop_reason": res.stop_reason,
                "raw_tokens": torch.tensor(getattr(res, "raw_tokens", res.tokens), dtype=torch.long),
                "min_len": int(getattr(res, "min_len", 0)),
                "diagnostics": {k: v for k, v in (diag or {}).items() if k in _DIAG_FIELDS}}
            path.parent.mkdir(parents=True, exist_ok=True)
            # no fsync: the checksum catches a torn file; the temporary names this process (a killed run's
            # is recognised)
            write_atomic(path, handoff.dumps(payload), durable=False)
        finally:
            with self._lock:
                if self._queued.get((key, segment)) is res:
                    del self._queued[(key, segment)]

    def _prune(self, live: set[str]) -> None:
        if not self.root.is_dir():
            return
        for entry in os.scandir(self.root):
            if entry.name.endswith(".cch") and entry.name.rsplit("-", 1)[0] not in live:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _listing(root: Path) -> dict[str, set[int]]:
    """The segments stored under ``root`` by token key (one listing, when a store opens)."""
    known: dict[str, set[int]] = {}
    if not root.is_dir():
        return known
    for entry in os.scandir(root):
        key, _, seg = entry.name.removesuffix(".cch").rpartition("-")
        if entry.name.endswith(".cch") and seg.isdigit():
            known.setdefault(key, set()).add(int(seg))
    return known


def _unlink_segments(root: Path, key: str) -> None:
    """A row's segment files by name, 0, 1, ... until one is missing (no listing of the directory)."""
    for segment in itertools.count():
        try:
            os.unlink(root / f"{key}-{segment}.cch")
        except FileNotFoundError:
            return
