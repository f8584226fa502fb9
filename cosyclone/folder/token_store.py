"""Stage-0 checkpoint: each segment's talker result on disk, so a rerun redoes only code2wav.

Why: the talker is the sequential, expensive part of a row on a GPU; when code2wav fails for a row
(out of memory, a killed run between the two stages), the row's speech tokens are already known.
They are stored with the :mod:`cosyclone.base.handoff` serializer (exact bytes, checksummed) under
``OUT/.cosyclone/tokens/<fingerprint>-<segment>.cch``, keyed by the row's fingerprint, so a row whose
inputs changed never reuses them. A row's files are removed once its WAV is written; the tokens of a
row that failed after the talker stay for the next run. Tokens are a function of the row alone (its
seed and fingerprint), so reusing them gives exactly the tokens a fresh talker run would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

import torch

from cosyclone.base import handoff
from cosyclone.talker import TalkerResult
from cosyclone.talker.diagnostics import STOP_REASONS, SamplerRowDiagnostics, StopReason

_DIAG_FIELDS = {f.name for f in fields(SamplerRowDiagnostics)}


class TokenStore:
    """Talker results by (row id, segment), for the rows whose fingerprints ``keys`` gives."""

    def __init__(self, root: Path, keys: Mapping[str, str]) -> None:
        self.root = Path(root)
        self.keys = dict(keys)  # row id -> its token key (fingerprint.token_key: of the fingerprint parts)
        self.hits = 0

    def _path(self, row_id: str, segment: int) -> Path | None:
        key = self.keys.get(row_id)
        return None if key is None else self.root / f"{key}-{int(segment)}.cch"

    def get(self, row_id: str, segment: int) -> TalkerResult | None:
        """The stored result of this segment, None when there is none (or it does not read back)."""
        path = self._path(row_id, segment)
        if path is None or not path.is_file():
            return None
        try:
            data = handoff.load(path)
        except handoff.HandoffError:  # torn or damaged: the talker simply runs again
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
        """Store a fresh talker result (atomically); rows without a fingerprint are not stored."""
        path = self._path(row_id, segment)
        if path is None:
            return
        diag = res.diagnostics.to_dict() if res.diagnostics is not None else None
        payload: dict[str, Any] = {
            "tokens": torch.tensor(res.tokens, dtype=torch.long), "stop_reason": res.stop_reason,
            "raw_tokens": torch.tensor(getattr(res, "raw_tokens", res.tokens), dtype=torch.long),
            "min_len": int(getattr(res, "min_len", 0)),
            "diagnostics": {k: v for k, v in (diag or {}).items() if k in _DIAG_FIELDS}}
        with contextlib.suppress(OSError):  # a checkpoint that cannot be written only costs a rerun
            handoff.save(path, payload)  # its temporary names this process: a killed run's is recognised

    def discard(self, row_id: str) -> None:
        """Remove the row's stored segments (its WAV is written: they are no longer needed)."""
        key = self.keys.get(row_id)
        if key is None or not self.root.is_dir():
            return
        for path in self.root.glob(f"{key}-*.cch"):
            with contextlib.suppress(OSError):
                path.unlink()

    def prune(self) -> None:
        """Remove stored segments of fingerprints no row of this run has (inputs changed since)."""
        if not self.root.is_dir():
            return
        live = set(self.keys.values())
        for path in self.root.glob("*.cch"):
            if path.name.rsplit("-", 1)[0] not in live:
                with contextlib.suppress(OSError):
                    path.unlink()
