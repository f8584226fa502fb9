"""Records read like manifest lines: an id that would be a path is no record, a trace is written only where
its id and the folder allow, and the index notices any change of the records files, not only of their size."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder import layout as runfolder
from cosyclone.folder.totals import totals_of
from tests.hostile.users import make_read_only, open_tmp, run_unprivileged
from tests.run_folders import Row, write

__all__ = ["open_tmp"]  # the fixture, used by name


def _failed_reasons(out: Path) -> dict[str, int]:
    index = runfolder.open_index(out)
    try:
        return dict(totals_of(index.totals())["failed_reasons"])
    finally:
        index.close()


def test_the_index_notices_an_in_place_edit_of_the_same_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(out, [Row("a", 1), Row("b", 2, status="failed"), *[Row(f"ok{i}", 3 + i) for i in range(60)]])
    assert _failed_reasons(out) == {"exception": 1}
    path = out / runfolder.DIAG_NAME
    st = path.stat()
    data = path.read_bytes()
    assert data.count(b'"reason": "exception"') == 1 and len(data) > 3 * 4096  # an edit far from the tail
    path.write_bytes(data.replace(b'"reason": "exception"', b'"reason": "exceptiom"'))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # as an editor a second later leaves it
    assert path.stat().st_size == st.st_size
    assert _failed_reasons(out) == {"exceptiom": 1}
    data = path.read_bytes()  # and an edit of the last lines, its time put back: the tail's hash tells it
    st = path.stat()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    path.write_bytes(data.replace(last, last.replace(b'"status": "ok"', b'"status": "no"')))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    index = runfolder.open_index(out)
    assert index.rebuilt
    index.close()


def test_trace_refuses_an_id_that_would_be_a_path(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "out"
    write(out, [Row("a", 1)])
    line = json.loads((out / runfolder.DIAG_NAME).read_text().splitlines()[0])
    with open(out / runfolder.DIAG_NAME, "a") as fh:
        fh.write(json.dumps({**line, "id": "../../evil"}) + "\n")
    res = CliRunner().invoke(app, ["trace", str(out), "../../evil"])
    assert res.exit_code == 2 and "must not contain '..'" in res.output, res.output
    assert not (tmp_path / "evil.jsonl").exists() and not (out / "traces").exists()


def test_a_trace_of_a_folder_the_user_cannot_write_goes_to_the_current_folder(open_tmp: Path) -> None:
    out = open_tmp / "run"
    write(out, [Row("a", 1)])
    make_read_only(out)
    code = ("import sys; from pathlib import Path; from cosyclone.trace.source import folder_trace_dir; "
            "print(folder_trace_dir(Path(sys.argv[1])))")
    res = run_unprivileged([str(out)], cwd=open_tmp, code=code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "traces/run"
    from cosyclone.trace.source import folder_trace_dir

    assert folder_trace_dir(open_tmp) == open_tmp / "traces"  # a folder this user may write: its own
