"""Issue 57's provenance half: the run record holds the model files' sizes and SHA-256, the talker, the
version and the licence; every audio file states it is synthetic speech made with those files (WAV INFO
chunk, FLAC Vorbis comment) and ``soundfile`` reads it back, also from an export's Parquet bytes through
HF ``datasets`` and from WebDataset members; equal runs still write equal bytes; ``--no-provenance-tag``
is recorded and redoes the rows."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.audio_out import encode
from cosyclone.folder.fingerprint import HashCache
from cosyclone.folder.provenance import USED_FILES, find_licence
from cosyclone.options import AudioEncoding, AudioFormat
from tests.run_folders import synth_cli, two_row_manifest

STATED = "synthetic speech made by cosyclone"


def _files(out: Path) -> dict[str, bytes]:
    found = sorted((out / "wavs").rglob("*"))
    return {p.name: p.read_bytes() for p in found if p.suffix in (".wav", ".flac")}


def _assert_states_the_model(data: bytes, model: Path, talker: str = "llm.pt") -> None:
    comment = sf.SoundFile(io.BytesIO(data)).copy_metadata().get("comment", "")
    assert comment.startswith(STATED) and comment.endswith(f"talker {talker}"), comment
    for name in (USED_FILES[0], talker, *USED_FILES[1:]):
        assert f"{name} {hashlib.sha256((model / name).read_bytes()).hexdigest()}" in comment


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("prov")
    out = work / "out"
    return out, synth_cli(two_row_manifest(work), tiny_model_dir, out)


def test_the_run_record_holds_the_model_files_talker_and_version(run: tuple[Path, dict],
                                                                 tiny_model_dir: Path) -> None:
    from cosyclone.base.version import __version__

    out, last = run
    prov = last["provenance"]
    assert prov["cosyclone"] == __version__ and prov["llm"] == last["llm"] == "llm.pt" and prov["tagged"]
    files = {f["file"]: f for f in prov["model_files"]}
    assert set(files) == {"llm.pt", *USED_FILES}
    for name, f in files.items():
        data = (tiny_model_dir / name).read_bytes()
        assert f["bytes"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    assert prov["licence"] is None  # the tiny model folder holds none
    assert last["output"]["provenance_tag"] is True


def test_every_file_states_it_and_equal_runs_write_equal_bytes(run: tuple[Path, dict], tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    out, _ = run
    files = _files(out)
    assert len(files) == 2
    for data in files.values():
        _assert_states_the_model(data, tiny_model_dir)
        with wave.open(io.BytesIO(data)) as w:  # the samples stay where plain readers look for them
            assert w.getnframes() > 0
    again = tmp_path / "again"
    synth_cli(two_row_manifest(tmp_path), tiny_model_dir, again)
    assert _files(again) == files  # no time in the tag

    flac = tmp_path / "flac"
    synth_cli(two_row_manifest(tmp_path), tiny_model_dir, flac, "--audio-format", "flac",
              "--audio-encoding", "pcm24")
    for name, data in _files(flac).items():
        _assert_states_the_model(data, tiny_model_dir)
        same, _ = sf.read(io.BytesIO(files[name.replace(".flac", ".wav")]), dtype="int32")
        assert np.abs(sf.read(io.BytesIO(data), dtype="int32")[0] - same).max() < 2**16  # one PCM16 step


def test_no_provenance_tag_writes_untagged_files_is_recorded_and_redoes_the_rows(tiny_model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    m, out = two_row_manifest(tmp_path), tmp_path / "out"
    synth_cli(m, tiny_model_dir, out)
    tagged = _files(out)
    last = synth_cli(m, tiny_model_dir, out, "--no-provenance-tag")
    assert last["redone_by"] == {"options": 2} and last["output"]["provenance_tag"] is False
    assert not last["provenance"]["tagged"]
    for name, data in _files(out).items():
        assert "comment" not in sf.SoundFile(io.BytesIO(data)).copy_metadata()
        assert data != tagged[name] and sf.read(io.BytesIO(data))[0].tolist() == sf.read(
            io.BytesIO(tagged[name]))[0].tolist()  # the same samples, without the chunk


def test_exports_keep_the_tag_and_their_card_states_the_provenance(
        run: tuple[Path, dict], tiny_model_dir: Path, tmp_path: Path) -> None:
    import datasets

    out, last = run
    for fmt in ("parquet", "webdataset", "nemo"):
        res = CliRunner().invoke(app, ["export", str(out), "--format", fmt, "--to", str(tmp_path / fmt)])
        assert res.exit_code == 0, res.output
        marker = json.loads((tmp_path / fmt / "export.json").read_text())
        assert [m["provenance"] for m in marker["made_by"]] == [last["provenance"]]
    for fmt in ("parquet", "webdataset"):
        card = (tmp_path / fmt / "README.md").read_text()
        assert "**synthetic speech**" in card and "- synthetic-speech" in card and "talker: `llm.pt`" in card
        for f in last["provenance"]["model_files"]:
            assert f"| `{f['file']}` | {f['bytes']} | `{f['sha256']}` |" in card
    # a cache of its own: datasets keys an export's cache by its path and sizes, which a rerun of this test
    # at a reused tmp path matches with other run ids
    ds = datasets.load_dataset(str(tmp_path / "parquet"), split="train", cache_dir=str(tmp_path / "hf"))
    assert set(ds["llm"]) == {"llm.pt"} and set(ds["run_id"]) == {last["run_id"]}
    for row in ds.cast_column("audio", datasets.Audio(decode=False)):
        _assert_states_the_model(row["audio"]["bytes"], tiny_model_dir)
    with tarfile.open(next((tmp_path / "webdataset").glob("*.tar"))) as tar:
        members = [m for m in tar.getmembers() if m.name.endswith(".wav")]
        assert len(members) == 2
        for m in members:
            fh = tar.extractfile(m)
            assert fh is not None
            _assert_states_the_model(fh.read(), tiny_model_dir)


def test_the_tag_follows_the_samples_and_changes_nothing_else() -> None:
    x = (np.sin(np.arange(2401) / 9.0) * 0.5).astype(np.float32)  # odd: a PCM24 body gets a pad byte
    cases: tuple[tuple[AudioFormat, AudioEncoding], ...] = (
        ("wav", "pcm16"), ("wav", "pcm24"), ("wav", "float"), ("flac", "pcm16"), ("flac", "pcm24"))
    for fmt, enc in cases:
        plain = encode(x, sample_rate=24000, fmt=fmt, encoding=enc)
        tagged = encode(x, sample_rate=24000, fmt=fmt, encoding=enc, tag="synthetic speech é")
        assert tagged == encode(x, sample_rate=24000, fmt=fmt, encoding=enc, tag="synthetic speech é")
        if fmt == "wav":
            assert tagged.startswith(plain[:4]) and tagged[8:len(plain)] == plain[8:]  # a chunk appended
        meta = sf.SoundFile(io.BytesIO(tagged)).copy_metadata()
        assert meta["comment"] == "synthetic speech é" and meta["software"].startswith("cosyclone ")
        assert np.array_equal(sf.read(io.BytesIO(tagged))[0], sf.read(io.BytesIO(plain))[0])
        assert "comment" not in sf.SoundFile(io.BytesIO(plain)).copy_metadata()


def test_the_licence_is_a_licence_file_or_the_hub_readme_s_front_matter(tmp_path: Path) -> None:
    hashes = HashCache(tmp_path / "hashes.json")
    model = tmp_path / "model"
    model.mkdir()
    assert find_licence(model, hashes) is None
    (model / "README.md").write_text("---\nlicense: apache-2.0\nlanguage:\n- en\n---\n# Fun-CosyVoice3\n")
    found = find_licence(model, hashes)
    assert found is not None and (found.file, found.id, found.text) == ("README.md", "apache-2.0", None)
    (model / "LICENSE").write_text("Apache License\nVersion 2.0\n")
    found = find_licence(model, hashes)
    assert found is not None and found.file == "LICENSE" and found.text == "Apache License\nVersion 2.0\n"
    assert found.sha256 == hashlib.sha256(b"Apache License\nVersion 2.0\n").hexdigest()


def test_trace_replays_a_row_with_the_talker_and_the_tag_its_run_recorded(run: tuple[Path, dict]) -> None:
    from cosyclone.trace.source import from_folder

    out, last = run
    got = from_folder(out, "r0", model_dir=None, device="cpu", threads=None)
    assert got.opts.llm == last["llm"] and got.output.tag == last["provenance"]["statement"]
