"""``export`` under careless and hostile use: a target is accepted before anything is touched and a user's
files are never removed; every file a record names is read as a checked file (regular, not a link, capped);
an embedded prompt must be the one the row was made from; loaders' keys stay out of a format's top level;
a record that is not a record is named."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf
from typer.testing import CliRunner, Result

from cosyclone.cli import app
from cosyclone.errors import CosycloneError
from cosyclone.export.build import export
from cosyclone.export.lock import read_marker
from cosyclone.folder import layout as runfolder
from cosyclone.folder.row_record import RowRecord
from tests.every_record import read_records
from tests.run_folders import ROOT, Row, tone, write


def _folder(out: Path, n: int = 3, **row: object) -> Path:
    write(out, [Row(f"r{i}", i + 1, **row) for i in range(n)])  # type: ignore[arg-type]
    return out


def _audio(out: Path, row_id: str) -> Path:
    rec = read_records(out)[row_id]
    path = runfolder.audio_path(out, rec)
    assert path is not None
    return path


def _export(*args: str) -> Result:
    return CliRunner().invoke(app, ["export", *args])


def test_a_users_folder_is_refused_before_anything_is_touched(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my project\n")
    (mine / "manifest.jsonl").write_text('{"id": "mine"}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    res = _export(str(out), "--to", str(mine), "--format", "nemo")
    assert res.exit_code == 2 and "no export.json" in res.output, res.output
    assert (mine / "README.md").read_text() == "my project\n"
    assert (mine / "manifest.jsonl").read_text() == '{"id": "mine"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no lock, no staging folder


@pytest.mark.parametrize("target", ["/", "{tmp}/a/file.txt", "{tmp}/missing/set"])
def test_a_target_that_is_not_a_folder_of_its_own_is_one_line(target: str, tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "file.txt").write_text("x")
    res = _export(str(out), "--to", target.format(tmp=tmp_path))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert not Path("/..lock").exists() and not (tmp_path / "missing").exists()
    assert (tmp_path / "a" / "file.txt").read_text() == "x"


def test_an_earlier_exports_unlisted_entries_are_carried_and_a_clash_refuses(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    target = tmp_path / "set"
    export(out, fmt="nemo", to_dir=target)
    notes = {"README.md": b"my card\n", "manifest_old.jsonl": b"{}\n", "data-00001.tar": b"tar?",
             "recordings.jsonl.gz": b"gz?"}
    for name, data in notes.items():
        (target / name).write_bytes(data)
    os.symlink(tmp_path / "nowhere", target / "data-00009.parquet")  # a broken link
    os.mkfifo(target / "manifest_fifo.jsonl")
    assert export(out, fmt="nemo", to_dir=target).rows == 3
    assert {n: (target / n).read_bytes() for n in notes} == notes
    assert os.readlink(target / "data-00009.parquet") == str(tmp_path / "nowhere")
    assert (target / "manifest_fifo.jsonl").is_fifo()
    marker = read_marker(target)
    assert marker is not None and [s["file"] for s in marker["shards"]] == ["manifest.jsonl"]
    (target / "train.txt").write_text("mine")
    export(out, fmt="nemo", to_dir=target, splits=["validation=0.5"])  # new names: no clash
    (target / "manifest.jsonl").write_text("mine now\n")  # not listed in this marker: the user's
    with pytest.raises(CosycloneError, match="your file manifest.jsonl has the name of a file this export"):
        export(out, fmt="nemo", to_dir=target)
    assert (target / "manifest.jsonl").read_text() == "mine now\n" and (target / "train.txt").exists()


def _prompted(tmp_path: Path) -> tuple[Path, Path]:
    prompt, other = tmp_path / "voice.wav", tmp_path / "other.wav"
    sf.write(str(prompt), tone(3, 0.5), 16000)
    sf.write(str(other), tone(5, 0.5), 16000)

    def parts(path: Path) -> dict[str, object]:
        return {"fingerprint_parts": {"prompt_audio": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}}

    out = tmp_path / "out"
    write(out, [Row("p1", 1, prompt_audio=str(prompt), extra=parts(prompt)),
                Row("p2", 2, prompt_audio=str(prompt), extra=parts(prompt)),
                Row("p3", 3, prompt_audio=str(other), extra=parts(other)),
                Row("p4", 4, prompt_audio=str(other))])
    return out, prompt


def test_a_prompt_swapped_after_the_run_is_skipped_with_its_reason_and_none_of_its_bytes(
    tmp_path: Path,
) -> None:
    out, prompt = _prompted(tmp_path)
    summary = export(out, fmt="webdataset", to_dir=tmp_path / "ok", include_prompt_audio=True)
    assert summary.rows == 3 and summary.skipped["prompt_mismatch"] == 1  # p4 recorded no prompt hash
    secret = tmp_path / "private.wav"
    sf.write(str(secret), tone(9, 0.5) * 0.9, 16000)
    prompt.unlink()
    prompt.symlink_to(secret)  # swapped for a link to a private file
    summary = export(out, fmt="webdataset", to_dir=tmp_path / "w", include_prompt_audio=True)
    marker = read_marker(tmp_path / "w")
    assert summary.rows == 1 and marker is not None
    skipped = {s["id"]: s for s in marker["skipped"]}
    assert {k: v["reason"] for k, v in skipped.items()} == dict.fromkeys(("p1", "p2", "p4"),
                                                                         "prompt_mismatch")
    assert "not the file the row was made from" in skipped["p1"]["detail"]
    assert all(secret.read_bytes()[100:1100] not in s.path.read_bytes() for s in summary.shards)


def test_a_prompt_swapped_for_a_special_file_is_refused_by_kind(tmp_path: Path) -> None:
    from cosyclone.export.rows import prompt_blob

    fifo = tmp_path / "fifo.wav"
    os.mkfifo(fifo)
    got = prompt_blob(str(fifo), {"prompt_audio": "0" * 16})  # no hang: opened without blocking
    assert isinstance(got, tuple) and got[0] == "prompt_mismatch" and "a FIFO" in got[1]
    got = prompt_blob("/dev/zero", {"prompt_audio": "0" * 16})
    assert isinstance(got, tuple) and got[0] == "prompt_mismatch" and "character device" in got[1]


def test_a_fifo_a_device_and_a_link_in_wavs_cost_one_skipped_row_each(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", 5)
    for row_id, swap in (("r0", "fifo"), ("r1", "zero"), ("r2", "link")):
        path = _audio(out, row_id)
        path.unlink()
        if swap == "fifo":
            os.mkfifo(path)
        elif swap == "zero":
            path.symlink_to("/dev/zero")
        else:  # another row's file of the same length
            path.symlink_to(_audio(out, "r3"))
    code = "import sys; from cosyclone.cli import app; sys.argv[0] = 'cosyclone'; app()"
    res = subprocess.run([sys.executable, "-c", code, "export", str(out), "--to", str(tmp_path / "set")],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=600)  # a guard for a hang, not a speed claim
    assert res.returncode == 0, res.stderr
    marker = read_marker(tmp_path / "set")
    assert marker is not None and marker["rows"] == 2
    skipped = {s["id"]: s for s in marker["skipped"]}
    assert {k: v["reason"] for k, v in skipped.items()} == dict.fromkeys(("r0", "r1", "r2"), "audio_mismatch")
    assert "a FIFO" in skipped["r0"]["detail"] and "symlink" in skipped["r1"]["detail"]


def test_loaders_keys_stay_inside_meta_and_lhotse_takes_numeric_speakers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    evil = {"audio_filename": "/etc/shadow", "offset": 3.0, "lang": "xx", "text_filepath": "/etc/passwd",
            "speaker": 1234, "language": "en"}
    write(out, [Row("a", 1, meta=evil), Row("b", 2, meta={"speaker": "ann"})])
    export(out, fmt="nemo", to_dir=tmp_path / "n")
    lines = [json.loads(x) for x in (tmp_path / "n" / "manifest.jsonl").read_text().splitlines()]
    for key in ("audio_filename", "offset", "lang", "text_filepath"):
        assert key not in lines[0], key
    assert json.loads(lines[0]["meta"])["audio_filename"] == "/etc/shadow"  # kept, inside meta
    pytest.importorskip("lhotse")
    from lhotse import load_manifest

    export(out, fmt="lhotse", to_dir=tmp_path / "l")
    sups = load_manifest(tmp_path / "l" / "supervisions.jsonl.gz")
    assert {s.id: (s.speaker, s.language) for s in sups} == {"a": ("1234", "en"), "b": ("ann", None)}


def test_a_record_whose_id_would_be_a_path_is_no_record(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out")
    path = out / runfolder.DIAG_NAME
    line = json.loads(path.read_text().splitlines()[0])
    assert RowRecord.from_json({**line, "id": "../../evil"}) is None
    path.write_text(path.read_text() + json.dumps({**line, "id": "../../evil"}) + "\n" + "{torn\n")
    summary = export(out, to_dir=tmp_path / "set")
    marker = read_marker(tmp_path / "set")
    assert summary.rows == 3 and marker is not None
    corrupt = [s["detail"] for s in marker["skipped"] if s["reason"] == "corrupt_record"]
    assert len(corrupt) == 2 and "line 4 (byte" in corrupt[0] and "no valid id" in corrupt[0]
    assert "line 5" in corrupt[1] and "not JSON" in corrupt[1]
    assert not (tmp_path / "evil").exists()


def test_a_split_too_small_for_its_rows_is_said(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", 10)
    res = _export(str(out), "--to", str(tmp_path / "s"), "--split", "validation=0.01")
    assert res.exit_code == 0 and "no row fell into split validation" in res.output, res.output


def test_wav_bytes_are_capped_by_the_record(tmp_path: Path) -> None:
    from cosyclone.folder.checked_read import NotARegularFile, audio_cap, read_checked

    big = tmp_path / "big.wav"
    sf.write(str(big), tone(1, 2.0), 24000)
    with pytest.raises(NotARegularFile, match="more than"):
        read_checked(big, audio_cap(10) - (1 << 20) + 100)
    assert sf.info(io.BytesIO(read_checked(big, audio_cap(48000)))).frames == 48000
