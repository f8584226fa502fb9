"""An export is whole or absent: built beside the old one and swapped in only when complete, one at a
time per target, with a marker naming what it holds and each row left out; a killed, failed or empty
export, or one beside a running synth, leaves the previous export as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.errors import CosycloneError, Exit
from cosyclone.export.build import NothingToExport, export
from cosyclone.export.lock import ExportBusy, ExportTarget, read_marker
from cosyclone.folder import layout as runfolder
from tests.run_folders import Row, write

REPO = Path(__file__).resolve().parents[2]

# an export in a child process that stops after its first shard, until it is killed
CHILD = """
import sys, time
from pathlib import Path
from cosyclone.export.build import export
def log(line):
    Path(sys.argv[3]).write_text(line)
    time.sleep(120)
export(sys.argv[1], fmt="parquet", to_dir=sys.argv[2], rows_per_shard=1, log=log)
"""


def _load(target: Path) -> list[str]:
    import datasets

    return list(datasets.load_dataset(str(target), split="train")["id"])


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    write(out, [Row(f"r{i}", i) for i in range(1, 4)] + [Row("bad", 4, status="failed")])
    return out


def test_a_killed_export_leaves_the_previous_one_whole_and_a_second_one_is_refused(folder: Path,
                                                                                   tmp_path: Path) -> None:
    target = tmp_path / "set"
    export(folder, fmt="parquet", to_dir=target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    write(folder, [Row(f"n{i}", 10 + i) for i in range(4)])  # the folder grew: the next export differs
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(target), str(ready)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child export did not start"
            time.sleep(0.1)
        with pytest.raises(ExportBusy, match="being written by another cosyclone export"):
            export(folder, fmt="parquet", to_dir=target)
        res = CliRunner().invoke(app, ["export", str(folder), "--to", str(target)])
        assert res.exit_code == Exit.BUSY, res.output
        assert "another cosyclone export" in res.output and "Traceback" not in res.output
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # untouched, byte for byte
    assert _load(target) == ["r1", "r2", "r3"] and (read_marker(target) or {}).get("rows") == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".set.new-")]  # the dead child's staging
    summary = export(folder, fmt="parquet", to_dir=target)  # the lock died with the child
    assert summary.rows == 7 and _load(target)[-1] == "n3"
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name or ".old-" in p.name]


def test_the_marker_names_rows_shards_sources_and_each_row_left_out(folder: Path, tmp_path: Path) -> None:
    runfolder.wav_path(folder, "r2").unlink()
    summary = export(folder, fmt="webdataset", to_dir=tmp_path / "w", rows_per_shard=1)
    marker = read_marker(tmp_path / "w")
    assert marker is not None and marker["rows"] == summary.rows == 2 and marker["records"] == 4
    assert [s["file"] for s in marker["shards"]] == ["data-00000-of-00002.tar", "data-00001-of-00002.tar"]
    assert [s["rows"] for s in marker["shards"]] == [1, 1]
    assert marker["sources"] == [{"folder": str(folder.resolve()), "state": "idle", "records": 4, "ok": 3,
                                  "exported": 2, "eval": False}]
    assert sorted((s["id"], s["reason"]) for s in marker["skipped"]) == [
        ("bad", "failed"),
        ("r2", "audio_missing"),
    ]
    assert {c["name"]: c["type"] for c in marker["columns"]}["seed"] == "uint64"


def test_zero_rows_is_an_error_that_keeps_the_old_export(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "set"
    export(folder, fmt="parquet", to_dir=target)
    before = sorted(p.name for p in target.iterdir())
    empty = tmp_path / "empty"
    write(empty, [Row("x", 1, status="failed")])
    with pytest.raises(NothingToExport, match="no row of .* can be exported .*failed 1.*keeps what it held"):
        export(empty, fmt="parquet", to_dir=target)
    res = CliRunner().invoke(app, ["export", str(empty), "--to", str(target)])
    assert res.exit_code == Exit.ROWS_FAILED and "Traceback" not in res.output
    assert sorted(p.name for p in target.iterdir()) == before and _load(target) == ["r1", "r2", "r3"]


def test_a_folder_a_synth_is_writing_is_refused_unless_asked(folder: Path, tmp_path: Path) -> None:
    import socket

    lock = runfolder.state_dir(folder) / "lock-all.json"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}))
    try:
        with pytest.raises(CosycloneError, match="being written by a cosyclone synth .*--allow-running"):
            export(folder, to_dir=tmp_path / "a")
        assert not (tmp_path / "a").exists()
        res = CliRunner().invoke(app, ["export", str(folder), "--to", str(tmp_path / "a")])
        assert res.exit_code == Exit.USAGE and "--allow-running" in res.output
        assert export(folder, to_dir=tmp_path / "a", allow_running=True).rows == 3
        marker = read_marker(tmp_path / "a")
        assert marker is not None and marker["sources"][0]["state"] == "running"
    finally:
        lock.unlink()


def test_a_failed_export_keeps_the_old_one_and_leaves_nothing_behind(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "set"
    export(folder, fmt="parquet", to_dir=target)

    def boom(line: str) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(runfolder.OutputFolderError, match="cannot write .*data-00000.parquet: No space left"):
        export(folder, fmt="parquet", to_dir=target, rows_per_shard=1, log=boom)
    assert _load(target) == ["r1", "r2", "r3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".set.lock", "out", "set"]


def test_a_swap_cut_between_its_two_renames_is_put_back_by_the_next_export(
    folder: Path, tmp_path: Path
) -> None:
    target = tmp_path / "set"
    export(folder, fmt="parquet", to_dir=target)
    os.replace(target, tmp_path / ".set.old-999999")  # what a kill between the fallback's renames leaves
    with ExportTarget(target) as place:
        assert place.target.is_dir() and _load(target) == ["r1", "r2", "r3"]
        assert not (tmp_path / ".set.old-999999").exists()


def test_a_target_holding_folders_of_its_own_is_refused(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "data" / "mine").mkdir(parents=True)
    with pytest.raises(CosycloneError, match=r"holds files \(mine\) and no export.json"):
        export(folder, to_dir=tmp_path / "data")
    assert (tmp_path / "data" / "mine").is_dir()
    export(folder, to_dir=tmp_path / "set")
    (tmp_path / "set" / "mine").mkdir()  # an earlier export's, with a folder put in it
    with pytest.raises(CosycloneError, match="holds folders .*mine.* no export wrote"):
        export(folder, to_dir=tmp_path / "set")
    assert (tmp_path / "set" / "mine").is_dir()
