"""A run's end in a big folder costs its own rows: the journal appended, the index and metadata told.

The checks here are by what is read and held, not by time: a folder whose earlier records were
blanked after indexing still settles, plans and totals right (so none of it re-read them), and the
memory an index build peaks at does not grow with the folder.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import numpy as np

from cosyclone.engine import RowResult
from cosyclone.folder import layout as runfolder
from cosyclone.folder.row_record import RowStamp
from cosyclone.folder.settle import settle
from cosyclone.folder.totals import totals_of
from cosyclone.folder.writer import BackgroundWriter, WriterOptions
from cosyclone.run.resume import plan_resume

from .test_index import record, write_lines


def stamp(rid: str) -> RowStamp:
    return RowStamp(
        fingerprint=f"fp-{rid}",
        fingerprint_parts={"text": "t"},
        run_id="run",
        text=f"t {rid}",
        prompt_text="p",
        prompt_audio="p.wav",
        mode="zero_shot",
        instruct="",
        speed=1.0,
        manifest="m",
        shard=None,
    )


def write(out: Path, rows: list[tuple[str, int, bool]]) -> set[str]:
    """(id, line, ok) rows through the real writer into the folder's journal; the touched directories."""
    writer = BackgroundWriter(WriterOptions(out_dir=out), runfolder.journal_path(out, "all"))
    try:
        for rid, line, ok in rows:
            audio = np.full(2400, 0.1, np.float32) if ok else None
            writer.write_now(
                RowResult(
                    id=rid,
                    line=line,
                    seed=1,
                    status="ok" if ok else "failed",
                    audio=audio,
                    audio_seconds=0.1 if ok else 0.0,
                ),
                stamp(rid),
            )
    finally:
        writer.close()
    return writer.touched


def metadata(out: Path) -> dict[str, str]:
    """id -> file of every metadata.jsonl line, resolved against its own directory."""
    found = {}
    for path in out.rglob("metadata.jsonl"):
        for line in path.read_text().splitlines():
            obj = json.loads(line)
            found[obj["id"]] = (path.parent / obj["file_name"]).relative_to(out).as_posix()
    return found


def blank_all_but_first_line(path: Path) -> None:
    """Every record line after the first, up to the index's tail bytes, replaced by spaces of its length,
    the modification time put back: the file's size, time, head and tail stay, so the index is still taken
    as up to date; whatever reads those records from now on reads nothing."""
    from cosyclone.folder.index import TAIL_BYTES

    data, st = path.read_bytes(), path.stat()
    first = data.index(b"\n") + 1
    last = data.rfind(b"\n", 0, len(data) - TAIL_BYTES) + 1
    path.write_bytes(data[:first] + b"".join(b" " * (len(x) - 1) + b"\n"
                                               for x in data[first:last].splitlines(keepends=True))
                     + data[last:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_run_appends_its_records_and_reads_none_of_the_folders_others(tmp_path: Path) -> None:
    old = [record(f"old{i}", i + 1, seconds=0.5) for i in range(2000)]
    write_lines(tmp_path / "diagnostics.jsonl", old)
    runfolder.open_index(tmp_path).close()  # indexed once
    before = (tmp_path / "diagnostics.jsonl").read_bytes()
    blank_all_but_first_line(tmp_path / "diagnostics.jsonl")
    blanked = (tmp_path / "diagnostics.jsonl").read_bytes()

    touched = write(tmp_path, [("new0", 1, True), ("new1", 2, False), ("old7", 8, True)])
    settle(tmp_path, "all", touched=touched)
    after = (tmp_path / "diagnostics.jsonl").read_bytes()
    assert after.startswith(blanked) and len(after.splitlines()) == 2000 + 3  # appended, not rewritten
    assert not runfolder.journal_path(tmp_path, "all").exists()

    index = runfolder.open_index(tmp_path)
    assert not index.rebuilt
    totals = totals_of(index.totals())
    assert (totals["rows"], totals["done"], totals["failed"]) == (2002, 2001, 1)
    assert totals["audio_seconds"] == round(1999 * 0.5 + 0.1 + 0.1, 6)
    plan = plan_resume(tmp_path, [], {}, index=index)  # looks up nothing it is not asked for
    assert plan.todo == [] and index.record(next(index.get_many(["new1"]))) is not None
    index.close()
    assert before != blanked  # (the check above read none of the blanked lines)
    listed = metadata(tmp_path)
    assert listed == {"new0": runfolder.wav_path(tmp_path, "new0").relative_to(tmp_path).as_posix(),
                      "old7": runfolder.wav_path(tmp_path, "old7").relative_to(tmp_path).as_posix()}


def test_a_flat_folder_still_reads_and_a_redone_flat_row_leaves_the_root_metadata(tmp_path: Path) -> None:
    rows = [record(rid, i + 1, file=f"wavs/{rid}.wav") for i, rid in enumerate(("a", "b"))]
    write_lines(tmp_path / "diagnostics.jsonl", rows)
    (tmp_path / "wavs").mkdir()
    import soundfile as sf

    for rid in ("a", "b"):
        sf.write(tmp_path / "wavs" / f"{rid}.wav", np.zeros(2400, np.float32), 24000)
    write_lines(
        tmp_path / "metadata.jsonl", [{"file_name": f"wavs/{rid}.wav", "id": rid} for rid in ("a", "b")]
    )
    index = runfolder.open_index(tmp_path)
    flat = {r.id: runfolder.is_complete(tmp_path, r) for r in index.get_many(["a", "b"])}
    index.close()
    assert flat == {"a": True, "b": True}

    settle(tmp_path, "all", touched=write(tmp_path, [("a", 1, True)]))  # redone: into its shard directory
    assert not (tmp_path / "wavs" / "a.wav").exists() and runfolder.wav_path(tmp_path, "a").is_file()
    assert metadata(tmp_path) == {"a": runfolder.wav_path(tmp_path, "a").relative_to(tmp_path).as_posix(),
                                  "b": "wavs/b.wav"}


def test_no_directory_of_wavs_gets_more_than_its_share() -> None:
    counts: dict[str, int] = {}
    for i in range(200_000):
        shard = runfolder.shard_of(f"utt_{i:08d}")
        counts[shard] = counts.get(shard, 0) + 1
    # ten million: ~2,500 a directory
    assert len(counts) == 4096 and max(counts.values()) < 2 * 200_000 / 4096


def test_building_the_index_holds_a_batch_of_rows_not_the_folder(tmp_path: Path) -> None:
    peaks = {}
    for n in (5_000, 20_000):
        out = tmp_path / f"f{n}"
        write_lines(out / "diagnostics.jsonl", [record(f"r{i}", i + 1) for i in range(n)])
        tracemalloc.start()
        index = runfolder.open_index(out)
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert index.rebuilt and index.count() == n
        index.close()
    assert peaks[20_000] < 1.5 * peaks[5_000], peaks


def test_a_whole_journal_moves_as_its_bytes_with_no_line_read_again(tmp_path: Path) -> None:
    write_lines(tmp_path / "diagnostics.jsonl", [record(f"old{i}", i + 1) for i in range(3)])
    runfolder.open_index(tmp_path).close()
    old = (tmp_path / "diagnostics.jsonl").read_bytes()
    ids = [f"new{i:02d}" for i in range(40)]
    touched = write(tmp_path, [(rid, i + 10, True) for i, rid in enumerate(ids)])
    journal = runfolder.journal_path(tmp_path, "all")
    blank_all_but_first_line(journal)  # what a line-by-line move would drop as not JSON
    blanked = journal.read_bytes()

    settle(tmp_path, "all", touched=touched)
    assert (tmp_path / "diagnostics.jsonl").read_bytes() == old + blanked and not journal.exists()
    index = runfolder.open_index(tmp_path)
    assert not index.rebuilt and index.count() == 43
    kept = [rid for rid in ids if f'"id": "{rid}"'.encode() in blanked]  # the first line and the tail's
    assert ids[0] in kept and ids[-1] in kept and len(kept) < len(ids)
    for row in index.get_many(kept):  # each row's offset moved with its line
        rec = index.record(row)
        assert rec is not None and rec.id == row.id
    index.close()


def test_a_journal_with_a_torn_line_moves_line_by_line_without_it(tmp_path: Path) -> None:
    write(tmp_path, [("a", 1, True), ("b", 2, False)])
    journal = runfolder.journal_path(tmp_path, "all")
    with open(journal, "ab") as fh:
        fh.write(b'{"id": "torn", "sta')  # a killed run's last line
    touched = write(tmp_path, [("c", 3, True)])  # the next run starts on a fresh line

    settle(tmp_path, "all", touched=touched)
    lines = (tmp_path / "diagnostics.jsonl").read_bytes().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["a", "b", "c"]
    index = runfolder.open_index(tmp_path)
    assert not index.rebuilt and index.count() == 3
    found = {r.id: getattr(index.record(r), "id", None) for r in index.get_many("abc")}
    assert found == {x: x for x in "abc"}
    index.close()


def test_a_night_of_many_directories_stages_its_metadata_as_one_file_at_a_time_would(tmp_path: Path) -> None:
    from cosyclone.folder.index_rows import meta_dir
    from cosyclone.folder.settle import STAGED_DIRS, write_metadata

    ids = [f"m{i:03d}" for i in range(3 * STAGED_DIRS)]
    settle(tmp_path, "all", touched=write(tmp_path, [(rid, i + 1, True) for i, rid in enumerate(ids)]))
    failed = ids[::2]  # redone and failed: their directories lose them (some all their rows)
    touched = write(tmp_path, [(rid, ids.index(rid) + 1, False) for rid in failed])
    assert len(touched) > STAGED_DIRS
    settle(tmp_path, "all", touched=touched)

    assert metadata(tmp_path) == {rid: runfolder.wav_path(tmp_path, rid).relative_to(tmp_path).as_posix()
                                  for rid in ids if rid not in failed}
    assert not list(tmp_path.rglob("*.tmp"))
    staged = {p: p.read_bytes() for p in tmp_path.rglob("metadata.jsonl")}
    index = runfolder.open_index(tmp_path)
    for rid in ids:  # each directory again, atomically on its own: the same bytes
        d = meta_dir(runfolder.wav_path(tmp_path, rid).relative_to(tmp_path).as_posix())
        assert d is not None
        write_metadata(tmp_path, index, d)
    index.close()
    assert {p: p.read_bytes() for p in tmp_path.rglob("metadata.jsonl")} == staged


def test_a_staged_metadata_file_that_cannot_go_in_place_fails_the_settle_and_leaves_no_temporary(
        tmp_path: Path) -> None:
    import pytest

    from cosyclone.folder.settle import STAGED_DIRS

    ids = [f"m{i:03d}" for i in range(3 * STAGED_DIRS)]
    touched = write(tmp_path, [(rid, i + 1, True) for i, rid in enumerate(ids)])
    (runfolder.wav_path(tmp_path, ids[5]).parent / "metadata.jsonl").mkdir()  # a name that takes no file
    with pytest.raises(runfolder.OutputFolderError, match="cannot write the metadata"):
        settle(tmp_path, "all", touched=touched)
    assert not list(tmp_path.rglob("*.tmp"))
