"""The batch plan of a run: rows sorted by estimated length and cut into batches.

The plan is the unit of the frontend and of code2wav, and it is the same wherever the rows run
(this process or a Ray actor), so a row is rendered in exactly the same batch either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosyclone.base.batching import chunks_by_length
from cosyclone.manifest import ManifestRow
from cosyclone.manifest.rows import PROMPT_TOKENS_PER_SECOND


def row_cost(row: ManifestRow) -> int:
    """Estimated padded work of one row, in sequence positions (what ``--token-budget`` counts).

    Characters of ``prompt_text + text + instruct`` (a generous stand-in for their text ids, which
    also grows with the speech tokens the row will generate) plus the prompt's speech tokens
    (25 per second of prompt audio, read from its header during validation). The prompt counts
    because it goes through the talker's prefill and through every flow step.
    """
    chars = len(row.prompt_text) + len(row.text) + len(row.instruct)
    return max(1, chars + int(round(PROMPT_TOKENS_PER_SECOND * row.prompt_seconds)))


def plan_batches(rows: Sequence[ManifestRow], batch_size: int,
                 token_budget: int | None = None) -> list[list[ManifestRow]]:
    """Rows sorted by estimated length (stable, so deterministic) and cut into batches of similar
    length, returned longest batch first.

    A batch holds at most ``batch_size`` rows and, with ``token_budget``, at most as many rows as
    keep ``len(batch) * max(row_cost)`` (its padded work) within the budget; a single row over the
    budget still gets a batch of its own. Longest first because a run's tail should be its
    shortest work (longest-processing-time-first): the continuous talker then keeps its slots full
    until the end (at the released geometry, 64 rows of 20-400 tokens in 8 slots, ascending order
    left 1308 decode steps for 1095 steps' worth of tokens, longest first 1116), Ray actors' last
    tasks are short, and a batch too big for the device fails in the first minutes, not the last.
    """
    by_line = sorted(rows, key=lambda r: r.line)  # ties in cost break by manifest line
    chunks = chunks_by_length([row_cost(r) for r in by_line], token_budget or 0, max_rows=max(1, batch_size))
    return [[by_line[i] for i in chunk] for chunk in reversed(chunks)]

