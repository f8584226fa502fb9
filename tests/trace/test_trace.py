"""``cosyclone trace`` on tiny models: a row made non-finite by one overflowing layer is traced to that
layer and its first step, a fine row is reproduced, and two precisions are compared step by step."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from cosyclone.cli import app
from tests.run_tokens import talker_tokens

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "example.jsonl"
HOT_LAYER = 1  # the tiny model's layer whose MLP is scaled until it overflows


def cli(*args: str | Path) -> Any:
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res


def trace_lines(out: Path, row_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "traces" / f"{row_id}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def hot_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with layer 1's MLP gate and up projections scaled by 1e20: their product overflows
    float32 (and bf16) at every position, so every row's logits are NaN from the first step."""
    d = tmp_path_factory.mktemp("hot") / "model"
    shutil.copytree(tiny_model_dir, d)
    state = torch.load(d / "llm.pt", weights_only=True)
    for name in ("gate_proj", "up_proj"):
        state[f"llm.model.model.layers.{HOT_LAYER}.mlp.{name}.weight"] *= 1e20
    torch.save(state, d / "llm.pt")
    return d


def test_a_nan_row_is_traced_to_the_scaled_layer_and_its_first_step(hot_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli("synth", MANIFEST, "--model-dir", hot_model, "--out", out, "--max-tokens", "25", "--quiet")
    assert res.exit_code == 3, res.output
    records = {r["id"]: r for r in map(json.loads, (out / "diagnostics.jsonl").read_text().splitlines())}
    assert {r["reason"] for r in records.values()} == {"no_finite_logits"}
    assert records["hello"]["sampler"][0]["all_nan_steps"] == 1

    res = cli("trace", out, "hello", "--layers", "--nonfinite-policy", "legacy-zero")
    assert res.exit_code == 0, res.output
    assert "reproduced: yes" in res.output
    assert f"first non-finite: segment 0 step 0 (the prompt's pass), layer {HOT_LAYER} at position 0 (sos)" \
        in res.output
    assert "touched: weights" in res.output
    assert "shared: same prompt 2 of 2 rows non-finite, same text 1 of 1, folder 4 of 4" in res.output
    # under legacy-zero the NaN logits read as 0.0: the row draws where the recorded one aborted
    assert re.search(r"compare \(nonfinite-policy legacy-zero\): first diverging draw at segment 0 step 0: "
                     r"aborted vs token \d+", res.output), res.output

    lines = trace_lines(out, "hello")
    verdict = lines[0]
    assert verdict["kind"] == "verdict" and verdict["reproduced"] is True
    assert verdict["talker_break"]["where"] == f"layer {HOT_LAYER}" and verdict["talker_break"]["step"] == 0
    layers = [x for x in lines if x["kind"] == "layer" and x["replay"] == "row" and x["call"] == 0]
    assert [(x["name"], x["finite"]) for x in layers] == [("layer 0", True), ("layer 1", False),
                                                          ("norm", False)]
    steps = [x for x in lines if x["kind"] == "step" and x["replay"] == "row"]
    assert len(steps) == 1 and steps[0]["aborted"] and steps[0]["nan"] > 0 and steps[0]["top"] == []


def test_a_fine_row_is_reproduced_token_for_token(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with talker_tokens() as made:
        res = cli("synth", MANIFEST, "--model-dir", tiny_model_dir, "--out", out, "--max-tokens", "25",
                  "--quiet")
    assert res.exit_code == 0, res.output
    res = cli("trace", out, "weather")
    assert res.exit_code == 0, res.output
    assert "reproduced: yes" in res.output
    assert re.search(r"audio: same (bytes|up to float32 rounding)", res.output), res.output
    assert "first non-finite: none" in res.output
    steps = [x for x in trace_lines(out, "weather") if x["kind"] == "step"]
    drawn = [s["token"] for s in steps if not s["stop"] and not s["aborted"]]
    assert drawn == made[("weather", 0)]  # the replay drew exactly what synth drew
    assert all(s["nan"] == s["posinf"] == 0 and s["logit_min"] is not None for s in steps)


def test_a_bf16_row_against_fp32_names_the_first_diverging_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli("synth", MANIFEST, "--model-dir", tiny_model_dir, "--out", out, "--dtype", "bf16", "--quiet")
    assert res.exit_code == 0, res.output
    pattern = re.compile(r"compare \(dtype fp32\): first diverging draw at segment 0 step (\d+): "
                         r"(.+?) vs (.+?);")
    for row in ("instruct", "crossling"):  # rows whose bf16 draws left fp32's within their length (Xeon, AMX)
        res = cli("trace", out, row, "--dtype", "fp32")
        assert res.exit_code == 0, res.output
        assert "reproduced: yes" in res.output
        assert "logits first differ at segment 0 step 0" in res.output  # bf16 rounds the first logits already
        found = pattern.search(res.output)
        if found:
            break
    assert found, res.output
    compare = trace_lines(out, row)[0]["compare"]
    assert compare["stage_dtypes"]["talker"] == "fp32"
    assert compare["divergence"]["step"] == int(found.group(1))


def test_a_row_whose_audio_overflows_is_traced_to_the_dit_block(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    state = torch.load(model / "flow.pt", weights_only=True)
    for name in ("ff.ff.0.0", "ff.ff.2"):  # the feed-forward of DiT block 1, scaled past float32
        state[f"decoder.estimator.transformer_blocks.1.{name}.weight"] *= 1e20
    torch.save(state, model / "flow.pt")
    out = tmp_path / "out"
    res = cli("synth", MANIFEST, "--model-dir", model, "--out", out, "--max-tokens", "10", "--quiet")
    assert res.exit_code == 3, res.output
    res = cli("trace", out, "hello", "--layers")
    assert res.exit_code == 0, res.output
    assert "reproduced: yes" in res.output and "first non-finite: none" in res.output
    assert "first non-finite in code2wav: flow block 1, call 0" in res.output
    assert "touched: code2wav" in res.output


def test_a_manifest_line_is_traced_without_a_folder(tiny_model_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = cli("trace", MANIFEST, "--id", "hello", "--model-dir", tiny_model_dir, "--max-tokens", "4",
              "--top", "2")
    assert res.exit_code == 0, res.output
    assert "replayed: tokens [4], stop ['max_len'], ok (no record to compare with)" in res.output
    steps = [x for x in trace_lines(tmp_path, "hello") if x["kind"] == "step"]
    assert len(steps) == 4 and all(len(s["top"]) == 2 for s in steps)


@pytest.mark.parametrize("args,message", [
    (["{out}"], "give the row as"),
    (["{manifest}"], "name the row with --id"),
    (["{out}", "nobody"], "no record of row 'nobody'"),
    (["{manifest}", "--id", "nobody"], "no row with id 'nobody'"),
])
def test_bad_input_is_one_line_naming_what_to_give(args: list[str], message: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "diagnostics.jsonl").write_text("")
    res = cli("trace", *[a.format(out=out, manifest=MANIFEST) for a in args])
    assert res.exit_code == 2 and message in res.output, res.output
    assert "Traceback" not in res.output


def test_help_fits_80_columns_and_offers_the_registry_options() -> None:
    res = CliRunner().invoke(app, ["trace", "--help"], env={"COLUMNS": "80", "TERM": "dumb"},
                             terminal_width=80)
    assert res.exit_code == 0
    assert all(len(line) <= 80 for line in res.output.splitlines())
    for flag in ("--layers", "--dtype", "--nonfinite-policy", "--id", "--seed", "--max-tokens", "--top"):
        assert flag in res.output
