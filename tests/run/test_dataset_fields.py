"""What a dataset builder reads of a run folder, through the real CLI on the tiny model (issue 52):
every value comes back exactly (seeds past 2**63, a Chinese text with a newline and an emoji, a
``meta`` speaker), the fields builders filter on are there (stop reason, normalized text, sample
rate), durations are the files', where a row ran never redoes it, the progress counts the rows to
make, and the folder still loads as an audiofolder after ``cosyclone eval``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.engine.outcome import join_segments
from cosyclone.talker.diagnostics import STOP_REASONS, row_stop_reason
from tests.run_folders import ROOT, diags, metadata_lines

QUICK = ["--device", "cpu", "--max-tokens", "6", "--n-timesteps", "1"]
ZH = "今天天气很好。\n我们去公园吧 🌳"
ROWS: list[dict[str, Any]] = [
    {"id": "big", "text": "The seed is past two to the sixty third.", "seed": 2**63},
    {
        "id": "max",
        "text": "The largest seed there is.",
        "seed": 2**64 - 1,
        "meta": {"speaker": "anna", "n": 2**64 - 1},
    },
    {"id": "zh", "text": ZH, "mode": "cross_lingual", "meta": {"speaker": "李雷 🎤", "language": "zh"}},
    {"id": "plain", "text": "A plain row."},
]


def _manifest(folder: Path) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    lines = [json.dumps({"prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words", **r},
                        ensure_ascii=False) for r in ROWS]
    lines.insert(
        2, json.dumps({"id": "typo", "prompt_audio": "prompts/speaker1.wav", "text": "x", "speakr": "y"})
    )
    path = folder / "m.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def synth(manifest: Path, model: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model), "--out", str(out),
                                    *QUICK, *extra])


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One trimmed run at 2 threads (its progress output kept), shared by the tests below."""
    folder = tmp_path_factory.mktemp("fields")
    manifest, out = _manifest(folder), folder / "out"
    res = synth(manifest, tiny_model_dir, out, "--threads", "2", "--trim-silence")
    assert res.exit_code == 3, res.output  # the typo row is refused; the others are made
    return manifest, out, res.output


def test_records_carry_the_fields_builders_filter_on(run: tuple[Path, Path, str]) -> None:
    _, out, _ = run
    records = diags(out)
    assert sorted(records) == ["big", "max", "plain", "zh"] and all(
        r["status"] == "ok" for r in records.values()
    )
    for rec in records.values():
        assert rec["stop_reason"] in STOP_REASONS and rec["stop_reason"] == row_stop_reason(
            rec["stop_reasons"]
        )
        assert rec["normalized_text"] == join_segments([s["text"] for s in rec["segments"]]) != ""
        assert rec["sample_rate"] == 24000 and (rec["device"], rec["threads"]) == ("cpu", "2")
    assert records["max"]["stop_reason"] == "max_len"  # 6 tokens cannot finish a sentence
    assert records["max"]["seed"] == 2**64 - 1 and records["big"]["seed"] == 2**63
    assert records["zh"]["meta"] == {"speaker": "李雷 🎤", "language": "zh"}
    assert records["plain"]["meta"] is None
    assert records["max"]["meta"]["n"] == 2**64 - 1


def test_metadata_and_totals_count_the_files_durations(run: tuple[Path, Path, str]) -> None:
    _, out, _ = run
    records = diags(out)
    lines = metadata_lines(out)
    total = 0.0
    for rid, m in lines.items():
        info = sf.info(str(out / m["file_name"]))
        assert (
            m["duration"] == pytest.approx(info.frames / info.samplerate)
            and m["sample_rate"] == info.samplerate
        )
        assert m["seed"] == str(records[rid]["seed"]) and m["stop_reason"] == records[rid]["stop_reason"]
        assert m["normalized_text"] == records[rid]["normalized_text"]
        total += info.frames / info.samplerate
    assert json.loads(lines["zh"]["meta"]) == records["zh"]["meta"] and lines["zh"]["text"] == ZH
    trimmed = sum(r["trimmed_lead_seconds"] + r["trimmed_trail_seconds"] for r in records.values())
    model_seconds = sum(r["audio_seconds"] for r in records.values())
    assert total == pytest.approx(model_seconds - trimmed, abs=1e-3)  # the files, after --trim-silence
    summary = json.loads((out / "summary.json").read_text())
    assert summary["audio_seconds"] == pytest.approx(total, abs=1e-5)
    report = json.loads(CliRunner().invoke(app, ["report", str(out), "--json"]).output)
    assert report["audio_seconds"] == summary["audio_seconds"] and report["flags"] == []
    assert (
        report["ran_on"] == {"device": {"cpu": 4}, "threads": {"2": 4}}
        and sum(report["versions"].values()) == 4
    )


def test_the_progress_total_is_the_rows_to_make(run: tuple[Path, Path, str]) -> None:
    _, _, output = run
    assert "synth: 4/4 rows (100%), 4 done, 0 failed" in output  # 5 lines, one refused


def test_a_rerun_at_another_thread_count_redoes_no_row_and_takes_a_new_meta(
        run: tuple[Path, Path, str], tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest, out, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = diags(copy)
    changed = tmp_path / "m.jsonl"  # the same rows, one speaker label corrected
    text = manifest.read_text(encoding="utf-8").replace('"李雷 🎤"', '"韩梅梅"')
    changed.write_text(text.replace('"prompts/', f'"{manifest.parent}/prompts/'), encoding="utf-8")
    res = synth(changed, tiny_model_dir, copy, "--threads", "1", "--trim-silence")  # the same command but -t
    assert res.exit_code == 3, res.output
    last = json.loads((copy / "summary.json").read_text())["last_run"]
    assert (last["skipped"], last["done"], last["redone"], last["redone_by"]) == (4, 0, 0, {})
    after = diags(copy)
    assert after["zh"]["meta"] == {"speaker": "韩梅梅", "language": "zh"}
    for rid, rec in before.items():  # still the run at 2 threads, audio and all; zh's record has the new meta
        keep = ("meta", "finished_at", "manifest") if rid == "zh" else ()
        assert {k: v for k, v in after[rid].items() if k not in keep} == {
            k: v for k, v in rec.items() if k not in keep}
    meta = {rid: m["meta"] for rid, m in metadata_lines(copy).items()}
    assert json.loads(meta["zh"])["speaker"] == "韩梅梅"


def test_the_folder_loads_as_an_audiofolder_with_exact_values_after_eval(run: tuple[Path, Path, str],
                                                                         tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from cosyclone.eval.asr import AsrOptions, Transcript
    from cosyclone.eval.evaluate import EvalOptions, Models, evaluate
    from cosyclone.eval.record import EvalRecord

    manifest, out, _ = run
    folder = tmp_path / "scored"
    shutil.copytree(out, folder)
    # an older eval's files
    (folder / "eval.jsonl").write_text('{"id": "plain", "status": "ok", "line": 5}\n')
    (folder / "eval_summary.json").write_text("{}")

    class HeardAll:
        """An ASR that hears every row's text (eval's own models are tested in tests/eval)."""

        def info(self) -> dict[str, str]:
            return {"backend": "stand-in"}

        def transcribe(self, waves: list, hints: list) -> list[Transcript]:
            return [Transcript("hello", "en", "forced", None) for _ in waves]

    result = evaluate(folder, manifest, EvalOptions(asr=AsrOptions(model="-")),
                      models=Models(asr=HeardAll(), encoders=[]))  # type: ignore[arg-type]
    assert all(isinstance(r, EvalRecord) for r in result.records) and len(result.records) == 4
    assert (folder / "scores.jsonl").is_file() and (folder / "scores_summary.json").is_file()
    assert not (folder / "eval.jsonl").exists() and not (folder / "eval_summary.json").exists()
    lines = [json.loads(x) for x in (folder / "scores.jsonl").read_text().splitlines()]
    # one schema: every field, every line
    assert {len(x) for x in lines} == {len(EvalRecord.__dataclass_fields__)}
    assert [EvalRecord.from_json(x) for x in lines] == result.records

    ds = datasets.load_dataset("audiofolder", data_dir=str(folder), split="train")
    got = {r["id"]: r for r in ds}
    assert sorted(got) == ["big", "max", "plain", "zh"]
    assert got["big"]["seed"] == str(2**63) and got["max"]["seed"] == str(2**64 - 1)
    assert got["zh"]["text"] == ZH and json.loads(got["zh"]["meta"])["speaker"] == "李雷 🎤"
    assert json.loads(got["plain"]["meta"]) is None and got["zh"]["audio"]["sampling_rate"] == 24000


def test_a_stopped_rerun_counts_as_redone_the_rows_it_wrote(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Eight rows redone for a new --seed, the run stopped after the first row is written: ``redone``
    counts the rows written (their records carry the run), not the eight it set out to make."""
    from cosyclone.base.stop import StopRequest
    from cosyclone.run.job import SynthJob
    from tests.run.test_runfolder import write_manifest

    manifest, out = write_manifest(tmp_path, 8), tmp_path / "out"
    fast: dict[str, Any] = {"device": "cpu", "max_tokens": 3, "n_timesteps": 1, "batch_size": 1}
    SynthJob.open(manifest, out, model_dir=tiny_model_dir, **fast).run()
    job = SynthJob.open(manifest, out, model_dir=tiny_model_dir, seed=1, **fast)
    job.stop = StopRequest(grace=60)

    class StopAfterOne:
        def update(self, result: object) -> None:
            assert job.stop is not None
            job.stop.request("SIGTERM")

        def close(self) -> None:
            pass

    summary = job.run(progress=lambda total: StopAfterOne())
    run = summary.last_run
    written = [r for r in diags(out).values() if r["run_id"] == run.run_id]
    assert run.stopped_by == "SIGTERM" and 1 <= len(written) < 8
    assert run.redone == len(written) == run.done and run.redone_by == {"seed": len(written)}
