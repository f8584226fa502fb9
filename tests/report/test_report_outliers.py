"""Rows far outside the folder's own spread, without ASR: listed on the page and written as a redo manifest.

The folder is written directly (benchmarks/bench_report_html.py's writer): 40 ordinary rows (11 to 13
characters per second), one
that babbled to the cap (6x the seconds, 20 tokens per text token), one cut short (a fifth of the
seconds and tokens), and one with NaN steps but ordinary figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.bench_report_html import Row, write_folder
from cosyclone.cli import app
from cosyclone.eval.redo import redo_seed
from cosyclone.manifest import read_manifest
from cosyclone.report.build import merge_records
from cosyclone.report.figures import measure, read_eval
from cosyclone.report.listing import select
from cosyclone.report.outliers import find_outliers, spread


def _rows() -> list[Row]:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        text_ids = int(rng.integers(15, 30))
        text = ("a calm voice reads " * 10)[: text_ids * 4]
        # a bounded spread: normal noise puts a row past Tukey's fences now and then (0.7 % of rows)
        seconds = len(text.replace(" ", "")) / float(rng.uniform(11.0, 13.0))
        rows.append(Row(f"ok{i:02d}", text, seconds, int(seconds * 25), text_ids, seed=100 + i))
    text = ("a calm voice reads " * 10)[:80]
    rows.append(Row("babble", text, 40.0, 400, 20, stop="max_len", seed=7))
    rows.append(Row("cut", text, 1.1, 27, 20, seed=8))
    rows.append(Row("nan", text, 5.6, 140, 20, nan_steps=4, seed=9))
    return rows


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    rows = _rows()
    evals = {r.id: (0.02, 0.8) for r in rows}
    evals["ok05"] = (0.6, 0.3)  # the worst WER and similarity
    return write_folder(tmp_path / "out", rows, evals=evals)


def test_the_planted_rows_and_only_they_lie_outside_the_spread(planted: Path) -> None:
    records, _, _ = merge_records([planted])
    figures = measure(records.values(), read_eval([planted], records))
    outliers, spreads = find_outliers(figures)
    flagged = {(figures.records[o.index].id, o.measure) for o in outliers}
    assert flagged == {
        ("babble", "chars_per_s"),
        ("babble", "tokens_per_text_token"),
        ("cut", "chars_per_s"),
        ("cut", "tokens_per_text_token"),
    }
    babble = next(
        o for o in outliers if figures.records[o.index].id == "babble" and o.measure == "chars_per_s"
    )
    assert babble.excess < -1.0 and "babble" in babble.meaning
    assert 11.0 < spreads["chars_per_s"].median < 13.0
    listed = {figures.records[item.index].id: item.why for item in select(figures, outliers)}
    assert "cut at the token cap" in listed["babble"] and "sampler events" in listed["nan"]
    assert "highest WER/CER" in listed["ok05"] and "lowest speaker similarity" in listed["ok05"]
    ok05 = figures.records.index(records["ok05"])
    assert "lowest DNSMOS" in listed["ok05"] and figures.dnsmos[ok05] == pytest.approx(2.4)
    assert len(listed) <= 8 * 7 + 12


def test_a_spread_of_equal_values_flags_nothing_and_a_few_rows_are_not_judged() -> None:
    assert spread(np.full(50, 3.0)).limits() is None
    assert spread(np.array([1.0, 2.0, 50.0])).limits() is None  # fewer than MIN_ROWS
    mostly_equal = np.array([3.0] * 40 + [3.1, 2.9, 30.0])
    limits = spread(mostly_equal).limits()
    assert limits is not None and limits[1] < 30.0  # the mean deviation stands in for a zero IQR
    assert limits[0] < 2.9 and limits[1] > 3.1  # and the near values stay inside


def test_the_cli_lists_the_outliers_and_writes_their_redo_manifest(planted: Path, tmp_path: Path) -> None:
    page = tmp_path / "pages" / "night.html"
    page.parent.mkdir()
    res = CliRunner().invoke(app, ["report", str(planted), "--html", str(page), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.splitlines()[0])["rows"] == 43  # stdout keeps the JSON
    redo = page.with_name("night.redo.jsonl")
    assert f"wrote {redo}: 2 outlier rows" in res.output
    lines = [json.loads(x) for x in redo.read_text(encoding="utf-8").splitlines()]
    assert sorted(x["id"] for x in lines) == ["babble", "cut"]
    prompt = str((planted / "prompt.wav").resolve())
    for line in lines:
        seed = {"babble": 7, "cut": 8}[line["id"]]
        assert line["seed"] == redo_seed(line["id"], seed)  # the next seed of the row's redo chain, as eval's
        assert line["prompt_audio"] == prompt and line["mode"] == "zero_shot" and line["text"]
    manifest = read_manifest(redo)
    assert [r.id for r in manifest.rows] == [x["id"] for x in lines] and not manifest.errors
    text = page.read_text(encoding="utf-8")
    outliers = text.split('id="outliers"')[1].split('id="listen"')[0]
    assert "babble" in outliers and "cut" in outliers and "ok05" not in outliers


def test_a_folder_without_outliers_writes_an_empty_redo_manifest(tmp_path: Path) -> None:
    out = write_folder(tmp_path / "out", _rows()[:40])
    page = tmp_path / "calm.html"
    res = CliRunner().invoke(app, ["report", str(out), "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert page.with_name("calm.redo.jsonl").read_text() == ""
    assert "No row lies outside" in page.read_text(encoding="utf-8")


def test_shards_merge_as_report_merges_them(tmp_path: Path) -> None:
    rows = _rows()
    a = write_folder(tmp_path / "a", rows[:20])
    b = write_folder(tmp_path / "b", rows[19:])  # ok19 in both: a's attempt is the later (line 20 vs 1)
    records, where, warnings = merge_records([a, b])
    assert len(records) == 43 and where["ok19"] == a and where["ok20"] == b and len(warnings) == 1
    page = tmp_path / "both.html"
    res = CliRunner().invoke(app, ["report", str(a), str(b), "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert "43 rows" in res.output and "2 outlier rows" in res.output
    assert page.read_text(encoding="utf-8").count("<td>" + str(b) + "</td>") == 1  # b's run in the history


def test_speech_rate_counts_what_the_audio_says_not_the_instruction_before_it(tmp_path: Path) -> None:
    from cosyclone.report.figures import chars_of, spoken_text

    out = write_folder(tmp_path / "out", [Row("x", "Bonjour tout le monde.", 2.0, 50, 8)])
    line = json.loads((out / "diagnostics.jsonl").read_text())
    line["segments"][0]["text"] = (
        "You are a helpful assistant.<|endofprompt|>Bonjour tout le <|breath|>monde."
    )
    (out / "diagnostics.jsonl").write_text(json.dumps(line) + "\n")
    rec = merge_records([out])[0]["x"]
    assert spoken_text(rec).startswith("Bonjour") and chars_of(spoken_text(rec)) == len("Bonjourtoutlemonde.")
    figures = measure([rec], read_eval([out], {"x": rec}))
    assert figures.chars_per_s[0] == pytest.approx(19 / 2.0)


def test_a_run_folder_without_rows_still_gets_its_page_and_a_plain_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    page = tmp_path / "empty.html"
    res = CliRunner().invoke(app, ["report", str(tmp_path / "empty"), "--html", str(page)])
    assert res.exit_code == 2 and "not a run folder" in res.output and not page.exists(), res.output
    (tmp_path / "empty" / "diagnostics.jsonl").write_text("")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "empty"), "--html", str(page)])
    assert res.exit_code == 0, res.output
    assert "No ok row to listen to" in page.read_text(encoding="utf-8")


def test_eval_records_are_read_under_either_name(planted: Path) -> None:
    records, _, _ = merge_records([planted])
    before = read_eval([planted], records)
    (planted / "eval.jsonl").rename(planted / "scores.jsonl")  # the name that keeps an audiofolder loading
    after = read_eval([planted], records)
    assert len(after.rows) == len(before.rows) == 43 and after.backend == "resemblyzer"
    assert after.rows["ok05"].error_rate == 0.6 and after.rows["ok05"].similarity == 0.3
    assert after.rows["ok05"].dnsmos == pytest.approx(2.4)
