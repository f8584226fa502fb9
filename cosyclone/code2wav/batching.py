"""Cutting a batch into length-sorted chunks, for stages whose per-row cost grows with batch size.

On CPU the flow's DiT is bound by matmul throughput (a bigger batch cannot make a row cheaper)
and HiFT's activations fall out of cache in a large batch, so both run a big batch as a few
smaller padded ones. Sorting by length first keeps the padding in each chunk small. Every stage
here batches exactly (a row equals the row run alone), so chunking changes no output.
"""

from __future__ import annotations

from collections.abc import Sequence


def chunks_by_length(lengths: Sequence[int], max_frames: int) -> list[list[int]]:
    """Row indices sorted by length (ties by index), cut so ``len(chunk) * longest <= max_frames``.

    A row longer than ``max_frames`` still gets a chunk of its own; ``max_frames <= 0`` keeps
    every row in one chunk (in the sorted order).
    """
    order = sorted(range(len(lengths)), key=lambda i: (int(lengths[i]), i))
    if max_frames <= 0:
        return [order] if order else []
    chunks: list[list[int]] = []
    for i in order:
        n = max(1, int(lengths[i]))
        if chunks and (len(chunks[-1]) + 1) * n <= max_frames:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks
