"""``--shard i/N``: this machine's contiguous slice of a manifest, so N machines split a night with
no cluster (one output folder each; ``cosyclone report`` merges them)."""

from __future__ import annotations

from dataclasses import dataclass

from cosyclone.errors import CosycloneError


@dataclass(frozen=True)
class Shard:
    """``--shard i/N``: the i-th (0-based) of N contiguous slices of the manifest's non-blank lines."""

    index: int  # 0 <= index < count
    count: int  # number of shards (>= 1)

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            a, b = text.split("/")
            shard = cls(int(a), int(b))
        except ValueError as exc:
            raise CosycloneError(f"--shard must look like i/N (e.g. 0/4), not {text!r}") from exc
        if shard.count < 1 or not 0 <= shard.index < shard.count:
            raise CosycloneError(f"--shard {text}: need N >= 1 and 0 <= i < N")
        return shard

    def bounds(self, n: int) -> tuple[int, int]:
        """[start, stop) of this shard over ``n`` items; sizes differ by at most one."""
        start = (n * self.index) // self.count
        stop = (n * (self.index + 1)) // self.count
        return start, stop
