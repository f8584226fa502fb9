"""The current record of a folder's rows as report, eval and trace read it: through the index.

Why these pin what they pin: :mod:`cosyclone.folder.current` must answer what reading every record
answers (:func:`read_records`), for every row or a few looked up, and it must work on a folder that
cannot hold an index (there it builds one aside and leaves the folder as it was).
"""

from __future__ import annotations

from pathlib import Path

from cosyclone.folder import layout as runfolder
from cosyclone.folder.current import current_records, reading
from tests.every_record import read_records
from tests.folder.test_index import many, record, write_lines


def _folder(out: Path) -> None:
    lines = many(120, 7)
    lines.append({**lines[3], "status": "failed", "reason": "no_finite_logits", "finished_at": 5000.0})
    lines.append({**lines[4], "finished_at": 1.0, "status": "failed"})  # an older attempt read later
    write_lines(out / "diagnostics.jsonl", lines)
    with open(out / "diagnostics.jsonl", "a") as fh:
        fh.write('{"id": "torn", "sta\n')
    journal = runfolder.journal_path(out, "shard-1-of-2")
    write_lines(journal, [record("late", 121), record("r9", 10, finished_at=9e9)])


def _listing(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_the_current_records_are_what_reading_every_record_gives(tmp_path: Path) -> None:
    _folder(tmp_path)
    whole = read_records(tmp_path)
    assert current_records(tmp_path) == whole
    looked_up = current_records(tmp_path, ["r3", "r4", "late", "nope"])
    assert looked_up == {k: whole[k] for k in ("r3", "r4", "late")}
    assert whole["r3"].status == "failed" and whole["r9"].finished_at == 9e9


def test_a_folder_with_no_records_gives_none_and_is_left_as_it_was(tmp_path: Path) -> None:
    assert current_records(tmp_path) == {} and current_records(tmp_path, ["a"]) == {}
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_hold_an_index_is_read_through_one_built_aside(tmp_path: Path) -> None:
    redone = record("r2", 3, status="failed", finished_at=9e9)
    write_lines(tmp_path / "diagnostics.jsonl", [*many(40, 3), redone])
    (tmp_path / ".cosyclone").write_text("not a directory")  # no lock, no index can be made in it
    before = _listing(tmp_path)
    with reading(tmp_path) as index:
        aside = index.path
        assert not aside.is_relative_to(tmp_path) and index.count() == 40
    assert not aside.exists()  # removed after
    assert current_records(tmp_path) == read_records(tmp_path)
    assert current_records(tmp_path)["r2"].status == "failed"
    assert _listing(tmp_path) == before
