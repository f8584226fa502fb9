"""``report`` under careless and hostile use: the page writes over nothing it did not write and never lands
in a run folder; its redo manifest keeps ``meta`` and its printed command is shell-quoted; a folder that is
not a run folder, a corrupt record line, and a folder the user cannot write."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cosyclone.cli import app
from tests.hostile.users import make_read_only, open_tmp, run_unprivileged
from tests.run_folders import Row, write

__all__ = ["open_tmp"]  # the fixture, used by name


def _folder(out: Path) -> Path:
    write(out, [Row(f"r{i}", i + 1, meta={"speaker": "ann", "n": i}) for i in range(4)]
          + [Row("bad", 5, status="failed")])
    (out / "runs.jsonl").write_text(json.dumps({"run_id": "r", "versions": {}}) + "\n")
    (out / "summary.json").write_text('{"rows": 5}\n')
    return out


def _report(*args: str) -> Result:
    return CliRunner().invoke(app, ["report", *args])


def test_a_page_pointed_at_any_file_of_a_run_folder_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"diagnostics.jsonl", "runs.jsonl", "summary.json", "metadata.jsonl"} <= {p.name for p in files}
    assert any(p.suffix == ".wav" for p in files)
    for path in files + [out / "new.html"]:
        before = path.read_bytes() if path.exists() else None
        res = _report(str(out), "--html", str(path))
        assert res.exit_code == 2 and "Traceback" not in res.output, (path, res.output)
        assert (path.read_bytes() if path.exists() else None) == before, path
    assert not (out / "new.html").exists() and not list(out.rglob("*.redo.jsonl"))


def test_a_page_replaces_its_own_page_only(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    mine = tmp_path / "notes.html"
    mine.write_text("<html>my notes</html>")
    res = _report(str(out), "--html", str(mine))
    assert res.exit_code == 2 and "not a page cosyclone report wrote" in res.output
    assert mine.read_text() == "<html>my notes</html>" and not (tmp_path / "notes.redo.jsonl").exists()
    page = tmp_path / "night.html"
    assert _report(str(out), "--html", str(page)).exit_code == 0
    assert _report(str(out), "--html", str(page)).exit_code == 0  # its own page: replaced
    stray = tmp_path / "other.redo.jsonl"
    stray.write_text("mine\n")
    res = _report(str(out), "--html", str(tmp_path / "other.html"))
    assert res.exit_code == 2 and stray.read_text() == "mine\n" and not (tmp_path / "other.html").exists()


@pytest.mark.parametrize("target", ["{tmp}/missing/page.html", "{tmp}/adir", "{tmp}/adir/", "", "/"])
def test_a_page_path_that_cannot_be_a_page_is_one_line_and_leaves_nothing(target: str,
                                                                         tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    (tmp_path / "adir").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    res = _report(str(out), "--html", target.format(tmp=tmp_path))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.count("error:") == 1, res.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no folder made, no temporary page left


def test_the_redo_manifest_keeps_meta_and_the_command_is_shell_quoted(tmp_path: Path) -> None:
    from cosyclone.report.outliers import redo_bytes
    from tests.every_record import read_records

    out = _folder(tmp_path / "it's a run")
    recs = sorted(read_records(out).values(), key=lambda r: r.line)
    lines = [json.loads(x) for x in redo_bytes([r for r in recs if r.ok]).decode().splitlines()]
    assert [x["meta"] for x in lines] == [{"speaker": "ann", "n": i} for i in range(4)]
    page = tmp_path / "a page.html"
    res = _report(str(out), "--html", str(page))
    assert res.exit_code == 0, res.output
    command = next(line for line in res.output.splitlines() if "cosyclone synth" in line)
    assert shlex.split(command.split("(", 1)[1].split(" redoes")[0]) == [
        "cosyclone", "synth", str(tmp_path / "a page.redo.jsonl"), "--out", str(out)]


def test_a_folder_that_is_not_a_run_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    res = _report(str(tmp_path / "photos"))
    assert res.exit_code == 2 and "not a run folder" in res.output


def test_a_corrupt_record_line_is_named_by_line_and_byte(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    path = out / "diagnostics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    offset = len(lines[0])
    path.write_bytes(lines[0] + b'{"id": "r1", "status": "ok", \n' + b"".join(lines[2:]))
    res = _report(str(out), "--json")
    assert res.exit_code == 0, res.output
    assert f"diagnostics.jsonl line 2 (byte {offset}): not JSON" in res.output
    assert json.loads(res.stdout.splitlines()[-1])["rows"] == 4


def test_report_reads_a_folder_the_user_cannot_write_and_eval_refuses_in_one_line(open_tmp: Path) -> None:
    out = _folder(open_tmp / "out")
    expected = json.loads(_report(str(out), "--json").stdout)
    make_read_only(out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    res = run_unprivileged(["report", str(out), "--json"], cwd=open_tmp)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    keys = ("rows", "done", "failed")
    assert {k: got[k] for k in keys} == {k: expected[k] for k in keys}
    res = run_unprivileged(["report", str(out), "--html", str(open_tmp / "page.html")], cwd=open_tmp)
    assert res.returncode == 0 and (open_tmp / "page.html").stat().st_size > 0, res.stderr
    res = run_unprivileged(["eval", str(out)], cwd=open_tmp)
    assert res.returncode == 4 and "Traceback" not in res.stderr, res.stderr
    assert [x for x in res.stderr.splitlines() if x.strip()] == [
        f"error: {out} cannot be written (a read-only folder or mount): eval writes its scores there; "
        "report and export read such a folder as it is"]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_the_page_plays_only_checked_files(tmp_path: Path) -> None:
    import hashlib

    import soundfile as sf

    from cosyclone.folder.layout import audio_path
    from cosyclone.report.audio import source
    from cosyclone.report.build import _audio_reader, _prompt_reader
    from tests.every_record import read_records
    from tests.run_folders import tone

    prompt, secret = tmp_path / "voice.wav", tmp_path / "secret.wav"
    sf.write(str(prompt), tone(1, 0.5), 16000)
    sf.write(str(secret), tone(7, 0.5), 16000)
    parts = {"fingerprint_parts": {"prompt_audio": hashlib.sha256(prompt.read_bytes()).hexdigest()[:16]}}
    out = tmp_path / "out"
    write(out, [Row("a", 1, prompt_audio=str(prompt), extra=parts), Row("b", 2)])
    recs = read_records(out)
    a, b = recs["a"], recs["b"]
    wav_a, wav_b = audio_path(out, a), audio_path(out, b)
    assert wav_a is not None and wav_b is not None
    assert source(prompt, tmp_path, link_audio=False, read=_prompt_reader(a)).src is not None
    assert source(wav_a, tmp_path, link_audio=False, read=_audio_reader(a.samples)).src is not None
    prompt.unlink()
    prompt.symlink_to(secret)
    got = source(prompt, tmp_path, link_audio=False, read=_prompt_reader(a))
    assert got.src is None and "not the file the row was made from" in got.note
    wav_a.unlink()
    wav_a.symlink_to(wav_b)  # another row's file of the same length
    got = source(wav_a, tmp_path, link_audio=True, read=_audio_reader(a.samples))
    assert got.src is None and "symlink" in got.note
