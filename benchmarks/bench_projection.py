"""The projection ``make bench`` prints: 10,000 distinct-prompt rows of 10 s on one H100, from the
documented cost table (cosyclone/engine/projection.py: the frontend's figure MEASURED on the frontend
of the released geometry, benchmarks/released_frontend.py, its machine named; the talker's and
code2wav's ESTIMATES until a GPU run measures them), with the rows per second of each stage, of the
one device the talker and code2wav share, and what bounds the run. No model runs: this is
arithmetic over the table, which tests/engine/test_projection.py checks against the real scheduler
driven by stand-in stages of set costs."""

from __future__ import annotations

from cosyclone.engine.projection import H100, project

ROWS, ROW_SECONDS, SLOTS, PROMPT_WORKERS = 10_000, 10.0, 256, 14


def main() -> None:
    p = project(H100, rows=ROWS, row_seconds=ROW_SECONDS, slots=SLOTS, prompt_workers=PROMPT_WORKERS)
    print(f"  {p.describe()}")
    print(f"  ({SLOTS} talker slots, {PROMPT_WORKERS} prompt workers, a distinct prompt per row); the table:")
    for line in H100.sources:
        print(f"    {line}")


if __name__ == "__main__":
    main()
