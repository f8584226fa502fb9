"""The folder's index: built from the record files alone, kept up with them, and the totals it keeps.

Why these pin what they pin: the index is a cache of the record files, so every test compares what
it answers with what reading every record answers (:func:`read_records`, :func:`folder_totals`), and
the totals must come out the same bits whatever order rows arrive in (resumes, shards, redone rows).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from cosyclone.folder import layout as runfolder
from cosyclone.folder.totals import folder_totals, merged_totals, totals_of
from tests.every_record import read_records


def record(rid: str, line: int, *, status: str = "ok", finished_at: float = 1000.0, seconds: float = 0.1,
           nan: int = 0, reason: str | None = None, file: str | None = None) -> dict[str, Any]:
    """A row record line as a run writes it (the fields the index and the totals read)."""
    ok = status == "ok"
    return {
        "id": rid,
        "line": line,
        "status": status,
        "reason": None if ok else (reason or "exception"),
        "fingerprint": f"fp-{rid}",
        "fingerprint_parts": {"text": "t"},
        "file": (file or f"wavs/{runfolder.shard_of(rid)}/{rid}.wav") if ok else None,
        "samples": round(seconds * 24000) if ok else None,
        "sample_rate": 24000 if ok else None,
        "audio_seconds": seconds if ok else 0.0,
        "nonfinite_audio_samples": 0,
        "finished_at": finished_at,
        "sampler": [{"steps": 7, "nan_steps": nan, "all_nan_steps": 1 if nan > 2 else 0}],
        "text": f"t {rid}",
    }


def write_lines(path: Path, lines: list[dict[str, Any]], mode: str = "w") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as fh:
        fh.writelines(json.dumps(x, sort_keys=True) + "\n" for x in lines)


def index_totals(out: Path) -> dict[str, Any]:
    index = runfolder.open_index(out)
    try:
        return totals_of(index.totals())
    finally:
        index.close()


def read_totals(out: Path) -> dict[str, Any]:
    return folder_totals(read_records(out).values())


def many(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` records with seconds that do not add up exactly in floating point, some failed, some NaN."""
    rng = random.Random(seed)
    return [record(f"r{i}", i + 1, seconds=rng.uniform(0.1, 30.0), nan=rng.choice([0, 0, 1, 5]),
                   status=rng.choice(["ok", "ok", "ok", "failed"]), finished_at=1000.0 + rng.random())
            for i in range(n)]


def test_a_folder_of_an_earlier_version_is_indexed_once_from_its_records(tmp_path: Path) -> None:
    lines = many(300, 1)
    # redone
    lines.append({**lines[5], "status": "failed", "reason": "no_finite_logits", "finished_at": 5000.0})
    lines.append({**lines[6], "finished_at": 1.0, "status": "failed"})  # an older attempt read later: ignored
    write_lines(tmp_path / "diagnostics.jsonl", lines)
    with open(tmp_path / "diagnostics.jsonl", "a") as fh:
        fh.write('{"id": "torn", "sta\n')
    index = runfolder.open_index(tmp_path)
    assert index.rebuilt and index.count() == 300
    index.close()
    assert index_totals(tmp_path) == read_totals(tmp_path)
    again = runfolder.open_index(tmp_path)  # up to date: not built again
    assert not again.rebuilt
    current = read_records(tmp_path)
    assert [r.id for r in again.ok_rows()] == [
        r.id for r in sorted(current.values(), key=lambda r: r.line) if r.ok
    ]
    assert {r.id: r.status for r in again.get_many(["r5", "r6", "nope"])} == {
        "r5": "failed",
        "r6": lines[6]["status"],
    }
    again.close()


def test_the_index_reads_what_grew_and_is_built_again_when_a_file_was_rewritten(tmp_path: Path) -> None:
    diag = tmp_path / "diagnostics.jsonl"
    write_lines(diag, many(50, 2))
    runfolder.open_index(tmp_path).close()
    write_lines(
        diag, [record("late", 51, seconds=2.5), record("r3", 4, status="failed", finished_at=9e9)], "a"
    )
    index = runfolder.open_index(tmp_path)  # another process appended: read from where the index stopped
    assert not index.rebuilt and index.count() == 51
    index.close()
    assert index_totals(tmp_path) == read_totals(tmp_path)
    write_lines(diag, many(20, 3))  # rewritten whole (as an earlier version's compaction did)
    index = runfolder.open_index(tmp_path)
    assert index.rebuilt and index.count() == 20
    index.close()
    assert index_totals(tmp_path) == read_totals(tmp_path)
    (tmp_path / ".cosyclone" / "index.sqlite").write_bytes(b"not a database")
    index = runfolder.open_index(tmp_path)
    assert index.rebuilt and index.count() == 20
    index.close()


def test_kept_totals_are_the_same_bits_whatever_order_rows_arrive_in(tmp_path: Path) -> None:
    lines = many(400, 4)
    redos = [
        {**x, "finished_at": x["finished_at"] + 100, "audio_seconds": x["audio_seconds"] / 3}
        for x in lines[:50]
    ]
    want = None
    for k, order in enumerate(
        (lines + redos, list(reversed(redos + lines)), random.Random(5).sample(lines + redos, 450))
    ):
        out = tmp_path / f"f{k}"
        out.mkdir()
        index = runfolder.open_index(out)  # empty: rows arrive one by one, as a run writes them
        journal = runfolder.Journal(runfolder.journal_path(out, "all"))
        index.track(".cosyclone/journal-all.jsonl")
        for x in order:
            index.put(x, ".cosyclone/journal-all.jsonl", journal.append(x), journal.end)
        journal.close()
        got = totals_of(index.totals())
        index.close()
        want = want or got
        assert got == want == read_totals(out)
    assert want is not None and want["sampler"]["rows_with_nan"] > 0 and want["failed"] > 0


def test_report_merges_shard_folders_the_later_attempt_counting(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_lines(
        a / "diagnostics.jsonl",
        [record("x", 1, seconds=1.0), record("y", 2, status="failed", finished_at=9.0)],
    )
    write_lines(
        b / "diagnostics.jsonl",
        [
            record("y", 2, seconds=3.0, finished_at=10.0),
            record("z", 3, seconds=0.5),
            record("x", 1, nan=3, finished_at=1.0),
        ],
    )
    totals, warnings = merged_totals([a, b])
    merged = {**read_records(b), **{k: v for k, v in read_records(a).items() if k == "x"}}
    assert totals == folder_totals(merged.values())
    assert totals["done"] == 3 and totals["audio_seconds"] == 4.5 and totals["sampler"]["rows_with_nan"] == 0
    assert len(warnings) == 2 and all("the later attempt counts" in w for w in warnings)
