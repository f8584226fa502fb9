"""Tokens before bytes, for tests that compare two ``synth`` runs (the ``gpu`` tests above all).

Why: diagnostics.jsonl holds token counts, not ids, and two runs that part at one sampled token
differ in every WAV byte after it; a bare ``wavs_a == wavs_b`` then says "bytes differ" and nothing
about where. :func:`talker_tokens` records each segment's speech token ids as the talker hands
them to the run folder's stage-0 checkpoint (:class:`cosyclone.folder.token_store.TokenStore`);
:func:`run_difference` compares those first (the first differing row, segment and step), and only
where they agree the WAV files (how many bytes and samples differ, and the largest sample
difference: a numeric difference, not a sampling one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from benchmarks.gpu_verdict import files_difference, token_difference
from cosyclone.folder.token_store import TokenStore

Tokens = dict[tuple[str, int], list[int]]


@contextmanager
def talker_tokens() -> Iterator[Tokens]:
    """Within the block, every talker segment's raw speech token ids by (row id, segment)."""
    seen: Tokens = {}
    put = TokenStore.put

    def spy(self: TokenStore, row_id: str, segment: int, res: Any) -> None:
        seen[(row_id, int(segment))] = [int(t) for t in getattr(res, "raw_tokens", res.tokens)]
        put(self, row_id, segment, res)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TokenStore, "put", spy)
        yield seen


def run_difference(
    a: tuple[Tokens, Mapping[str, bytes]], b: tuple[Tokens, Mapping[str, bytes]]
) -> str | None:
    """Where two runs (token ids by segment, WAV bytes by file name) part, tokens first; None when
    they are the same. Refuses runs with no recorded tokens (the seam moved: the test would prove
    nothing)."""
    (ta, wa), (tb, wb) = a, b
    if not ta or not tb:
        return (
            f"no talker tokens recorded ({len(ta)} and {len(tb)} segments): "
            "TokenStore.put is no longer called"
        )
    if set(ta) != set(tb):
        return f"segments differ: only in the first {sorted(set(ta) - set(tb))}, only in the second " \
               f"{sorted(set(tb) - set(ta))}"
    keys = sorted(ta)
    diff = token_difference(
        [ta[k] for k in keys], [tb[k] for k in keys], names=[f"{r}/seg{s}" for r, s in keys]
    )
    if diff:
        return f"tokens part at {diff}"
    diff = files_difference(wa, wb)
    return f"tokens equal, WAV bytes differ: {diff}" if diff else None
