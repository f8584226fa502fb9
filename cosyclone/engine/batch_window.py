"""The run's batches by their index in the run, holding only those not yet admitted.

Why: a night feeds a pipeline part after part; a list of every batch fed (the frontend, the
prompt look-ahead and the scheduler index it by the batch's number in the run) grows with the
night. The window keeps those numbers and forgets the batches below the first one still wanted, so
what it holds is bounded by the parts in flight.

Must not: plan or reorder batches (:mod:`.batches`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cosyclone.manifest import ManifestRow


class BatchWindow(Sequence[list[ManifestRow]]):
    """Batches ``base`` .. ``len(self) - 1`` of a run (indices are the run's, not the window's)."""

    def __init__(self, batches: Iterable[Sequence[ManifestRow]] = ()) -> None:
        self._held: list[list[ManifestRow]] = []
        self.base = 0  # the run index of the first batch held (those before it were forgotten)
        self.extend(batches)

    def extend(self, batches: Iterable[Sequence[ManifestRow]]) -> None:
        self._held.extend(list(b) for b in batches)

    def __len__(self) -> int:
        return self.base + len(self._held)

    def __getitem__(self, k: int) -> list[ManifestRow]:  # type: ignore[override]
        if not isinstance(k, int):
            raise TypeError("a batch window is indexed by one run index")
        if k < self.base:
            raise IndexError(f"batch {k} was forgotten (the window starts at {self.base})")
        return self._held[k - self.base]

    def forget_before(self, k: int) -> None:
        """Drop the batches before run index ``k`` (admitted: nothing reads them again)."""
        n = min(max(0, k - self.base), len(self._held))
        if n:
            del self._held[:n]
            self.base += n

    def rows_from(self, k: int) -> int:
        """Rows in batches ``k`` .. the last one held."""
        return sum(len(b) for b in self._held[max(0, k - self.base):])
