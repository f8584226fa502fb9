"""Cutting rows into length-sorted chunks whose padded work stays within a budget.

One rule serves the run's batch plan (``--batch-size``/``--token-budget``, :mod:`cosyclone.engine.batches`)
and the CPU chunking of stage 1: on CPU the flow's DiT is bound by matmul throughput (a bigger batch cannot
make a row cheaper) and HiFT's activations fall out of cache in a large batch, so both run a big batch as a
few smaller padded ones. Sorting by length first keeps the padding in each chunk small. No stage lets rows of
a batch affect each other (a row gets the tokens it gets alone), so chunking changes the audio only by float32
rounding (kernels are chosen by shape: ~3e-7, at most one PCM16 step).
"""

from __future__ import annotations

from collections.abc import Sequence


def chunks_by_length(
    lengths: Sequence[int], max_frames: int, *, max_rows: int | None = None
) -> list[list[int]]:
    """Row indices sorted by length (ties by index), cut so ``len(chunk) * longest <= max_frames``.

    Sorted ascending, so a chunk's longest row is the one just added. A row longer than
    ``max_frames`` still gets a chunk of its own; ``max_frames <= 0`` sets no budget. ``max_rows``
    (None: no cap) also bounds the rows of a chunk.
    """
    order = sorted(range(len(lengths)), key=lambda i: (int(lengths[i]), i))
    chunks: list[list[int]] = []
    for i in order:
        n = max(1, int(lengths[i]))
        fits = bool(chunks) and (max_rows is None or len(chunks[-1]) < max_rows) and (
            max_frames <= 0 or (len(chunks[-1]) + 1) * n <= max_frames)
        if fits:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks
