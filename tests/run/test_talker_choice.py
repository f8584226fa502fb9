"""Issue 57's talker half, through real synth runs of a tiny model whose folder holds ``llm.rl.pt`` beside
``llm.pt`` (other weights, written by ``make-tiny-model --rl-talker``): ``--llm llm.rl.pt`` gives other
tokens, a rerun with the other talker redoes every row, every record and the run name the talker, and a
missing file or one of another shape is refused before any row runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.errors import CosycloneError
from cosyclone.options import RunOptions, audio_values
from tests.run_folders import FAST_SYNTH, synth_cli, two_row_manifest
from tests.run_tokens import talker_tokens


@pytest.fixture(scope="module")
def rl_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-rl")
    res = CliRunner().invoke(app, ["make-tiny-model", str(d), "--force", "--rl-talker"])
    assert res.exit_code == 0, res.output
    return d


def _records(out: Path) -> dict[str, dict]:
    lines = [json.loads(x) for x in (out / "diagnostics.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in sorted(lines, key=lambda r: r["finished_at"])}  # the latest of each id


def test_the_rl_talker_has_the_released_keys_and_other_weights(rl_model: Path) -> None:
    import torch

    a = torch.load(rl_model / "llm.pt", weights_only=True)
    b = torch.load(rl_model / "llm.rl.pt", weights_only=True)
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    res = CliRunner().invoke(app, ["inspect", str(rl_model), "--llm", "llm.rl.pt", "--device", "cpu"])
    assert "talker file: llm.rl.pt (also here: llm.pt" in res.output, res.output
    assert "llm.rl.pt: " in res.output and "keys ok" in res.output


def test_the_rl_talker_gives_other_tokens_and_a_rerun_with_it_redoes_every_row(rl_model: Path,
                                                                                tmp_path: Path) -> None:
    m, out = two_row_manifest(tmp_path), tmp_path / "out"
    with talker_tokens() as released:
        synth_cli(m, rl_model, out)
    assert {r["llm"] for r in _records(out).values()} == {"llm.pt"}
    last = json.loads((out / "summary.json").read_text())["last_run"]
    assert last["llm"] == "llm.pt" and last["options"]["llm"] == "llm.pt"

    with talker_tokens() as rl:
        synth_cli(m, rl_model, out, "--llm", "llm.rl.pt")
    assert released and rl.keys() == released.keys()
    assert any(rl[k] != released[k] for k in rl), "llm.rl.pt's weights gave the same tokens"
    last = json.loads((out / "summary.json").read_text())["last_run"]
    assert last["redone"] == 2 and last["redone_by"] == {"options": 2}
    assert last["llm"] == "llm.rl.pt" and last["provenance"]["llm"] == "llm.rl.pt"
    assert {r["llm"] for r in _records(out).values()} == {"llm.rl.pt"}

    synth_cli(m, rl_model, out, "--llm", "llm.rl.pt")  # the same talker again: nothing to redo
    assert json.loads((out / "summary.json").read_text())["last_run"]["skipped"] == 2
    synth_cli(m, rl_model, out)  # and back to llm.pt: every row again
    last = json.loads((out / "summary.json").read_text())["last_run"]
    assert last["redone"] == 2 and {r["llm"] for r in _records(out).values()} == {"llm.pt"}
    res = CliRunner().invoke(app, ["report", str(out), "--json"])
    assert json.loads(res.output)["talkers"] == {"llm.pt": 2}


def test_a_missing_talker_file_or_one_of_another_shape_is_refused_before_any_row(rl_model: Path,
                                                                                   tmp_path: Path) -> None:
    m = two_row_manifest(tmp_path)
    res = CliRunner().invoke(app, ["synth", str(m), "--model-dir", str(rl_model), "--out",
                                   str(tmp_path / "a"), "--llm", "llm.sft.pt", *FAST_SYNTH])
    assert res.exit_code == 2, res.output
    assert "--llm llm.sft.pt: no such file" in res.output and "llm.pt, llm.rl.pt" in res.output
    assert not (tmp_path / "a" / "diagnostics.jsonl").exists()

    other = tmp_path / "model"
    shutil.copytree(rl_model, other)
    shutil.copy(other / "flow.pt", other / "llm.rl.pt")  # a checkpoint of another module under the name
    res = CliRunner().invoke(app, ["synth", str(m), "--model-dir", str(other), "--out", str(tmp_path / "b"),
                                   "--llm", "llm.rl.pt", *FAST_SYNTH])
    assert res.exit_code != 0 and "llm.rl.pt" in res.output, res.output
    assert not (tmp_path / "b" / "diagnostics.jsonl").exists() or all(
        r["status"] != "ok" for r in _records(tmp_path / "b").values())


@pytest.mark.parametrize("name", ["/abs/llm.pt", "../llm.pt", "sub/../../llm.pt", ""])
def test_llm_names_a_file_inside_the_model_folder(name: str) -> None:
    with pytest.raises(CosycloneError, match="--llm"):
        RunOptions(llm=name)


def test_llm_is_fingerprinted_only_away_from_its_default() -> None:
    assert "llm" not in audio_values(RunOptions())  # folders written before --llm keep their fingerprints
    assert audio_values(RunOptions(llm="llm.rl.pt"))["llm"] == "llm.rl.pt"
    with pytest.raises(CosycloneError, match="--load-format dummy"):
        RunOptions(llm="llm.rl.pt", load_format="dummy")
