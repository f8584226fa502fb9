"""The synth job is one object: ``cosyclone synth`` and ``CosyClone.synth_folder`` write the same folder.

Same manifest, model and options through the CLI and through the API must give the same files:
the WAV bytes, ``metadata.jsonl`` and every field of the row records and totals except those that
say when and by which invocation they were made (run id, timestamps, per-stage seconds, argv).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "manifests" / "example.jsonl"
FAST: dict[str, Any] = {"max_tokens": 6, "n_timesteps": 2}
FAST_ARGS = ["--max-tokens", "6", "--n-timesteps", "2", "--device", "cpu", "--quiet"]
#: Fields that say when or by which invocation something was made; everything else must match.
VOLATILE = {
    "run_id",
    "finished_at",
    "started_at",
    "seconds",
    "wall_seconds",
    "total_wall_seconds",
    "rows_per_s",
    "throughput_audio_s_per_s",
    "rtf",
    "argv",
    "out_dir",
    "time",
    "stage_seconds",
    "stages",
    "peak_memory",
}  # a process's peak RSS depends on what ran in it before


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _folder(out: Path) -> dict[str, Any]:
    """Every file of a run folder, JSON files with their volatile fields removed, the rest as bytes."""
    files: dict[str, Any] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = str(path.relative_to(out))
        if rel.startswith((".cosyclone/lock", ".cosyclone/file-hashes", ".cosyclone/index.sqlite")):
            continue  # the index: derived from the records compared here, its bytes hold commit times
        if path.suffix == ".json":
            files[rel] = _strip(json.loads(path.read_text()))
        elif path.suffix == ".jsonl":
            files[rel] = [_strip(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        else:
            files[rel] = path.read_bytes()
    return files


@pytest.fixture(scope="module")
def tts(tiny_model_dir: Path):
    from cosyclone import CosyClone

    return CosyClone(tiny_model_dir, device="cpu", **FAST)


def test_synth_folder_writes_the_folder_cosyclone_synth_writes(
    tiny_model_dir: Path, tts, tmp_path: Path
) -> None:
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    res = CliRunner().invoke(
        app, ["synth", str(MANIFEST), "--model-dir", str(tiny_model_dir), "--out", str(cli_out), *FAST_ARGS]
    )
    assert res.exit_code == 0, res.output
    summary = tts.synth_folder(MANIFEST, api_out)
    assert summary.exit_code == 0 and summary.last_run.done == 4 and not summary.failed
    cli, api = _folder(cli_out), _folder(api_out)
    assert sorted(cli) == sorted(api)
    assert sum(1 for k in cli if k.endswith(".wav")) == 4
    for name in cli:
        assert cli[name] == api[name], name


def test_synth_folder_resumes_and_plans_like_the_cli(tiny_model_dir: Path, tts, tmp_path: Path) -> None:
    out = tmp_path / "o"
    first = tts.synth_folder(MANIFEST, out)
    assert first.last_run.done == 4
    job = tts.folder_job(MANIFEST, out, seed=1)  # a new run seed changes every row without a manifest seed
    plan = job.plan()
    assert (plan.valid_rows, plan.done, plan.todo, plan.rejected) == (4, 1, 3, 0)
    assert "3 rows redone: seed 3" in plan.resume
    dry = tts.folder_job(MANIFEST, out, seed=1, plan_only=True).plan()  # as --dry-run opens it
    assert (dry.valid_rows, dry.done, dry.todo, dry.rejected, dry.batches) == (4, 1, 3, 0, plan.batches)
    again = tts.synth_folder(MANIFEST, out)  # the original seed: the folder's rows are still done
    assert again.last_run.skipped == 4 and again.last_run.todo == 0
    res = CliRunner().invoke(
        app,
        [
            "synth",
            str(MANIFEST),
            "--model-dir",
            str(tiny_model_dir),
            "--out",
            str(out),
            *FAST_ARGS,
            "--dry-run",
        ],
    )
    assert res.exit_code == 0 and "4 already done, 0 to synthesize in 0 batches" in res.output, res.output


def test_synth_folder_refuses_options_of_the_loaded_model(tts, tmp_path: Path) -> None:
    from cosyclone.errors import CosycloneError

    with pytest.raises(CosycloneError, match="dtype belong to the loaded model"):
        tts.folder_job(MANIFEST, tmp_path / "o", dtype="bf16")
    with pytest.raises(CosycloneError, match="unknown option"):
        tts.folder_job(MANIFEST, tmp_path / "o", no_such_option=1)
    with pytest.raises(CosycloneError, match="--batch-size must be at least 1"):
        tts.folder_job(MANIFEST, tmp_path / "o", batch_size=0)


def _two_speaker_manifest(folder: Path) -> Path:
    import shutil

    prompts = folder / "prompts"
    prompts.mkdir(parents=True)
    for name in ("speaker1.wav", "speaker2.wav"):
        shutil.copy(ROOT / "manifests" / "prompts" / name, prompts / name)
    rows = [{"id": "stays", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words",
             "text": "This prompt stays where it was."},
            {"id": "moved", "prompt_audio": "prompts/speaker2.wav", "prompt_text": "reference words",
             "text": "This prompt is gone by the time the run starts."}]
    manifest = folder / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest


@pytest.mark.parametrize("change", ["vanishes", "turns_to_garbage"])
def test_a_prompt_that_changes_after_validation_fails_its_row_alone(tiny_model_dir: Path, tmp_path: Path,
                                                                   change: str) -> None:
    from cosyclone.run.job import SynthJob

    manifest = _two_speaker_manifest(tmp_path / "in")
    job = SynthJob.open(manifest, tmp_path / "out", model_dir=tiny_model_dir, device="cpu", **FAST)
    assert job.plan().valid_rows == 2  # a dry run reads the manifest (a run streams it: this one reuses it)
    assert [r.id for r in job.planned.rows.rows] == ["stays", "moved"]  # both valid when read
    victim = tmp_path / "in" / "prompts" / "speaker2.wav"
    if change == "vanishes":
        victim.unlink()
    else:
        victim.write_bytes(b"RIFF but not a wave file at all" * 8)
    summary = job.run()
    assert summary.exit_code == 3
    assert summary.last_run.done == 1 and summary.last_run.failed == 1
    (failed,) = summary.failed
    assert failed.id == "moved" and failed.line == 2 and failed.status == "failed"
    # vanished: the hash of its prompt raised (a traceback); garbage: the frontend's own user error
    expected = {"vanishes": ("exception", "prepare: FileNotFoundError"),
                "turns_to_garbage": ("bad_input", "frontend: AudioError")}[change]
    error = failed.error or ""
    assert (failed.reason, error.split(":", 2)[0] + ":" + error.split(":", 2)[1]) == expected
    records = {
        json.loads(x)["id"]: json.loads(x)
        for x in (tmp_path / "out" / "diagnostics.jsonl").read_text().splitlines()
    }
    assert records["stays"]["status"] == "ok" and wav_path(tmp_path / "out", "stays").is_file()
    assert records["moved"]["status"] == "failed" and not wav_path(tmp_path / "out", "moved").exists()
    errors_file = tmp_path / "out" / "errors.jsonl"  # tracebacks of non-user errors only
    errors = [json.loads(x) for x in errors_file.read_text().splitlines()] if errors_file.exists() else []
    assert any(e["id"] == "moved" and "Traceback" in e["traceback"] for e in errors) == (change == "vanishes")


@pytest.mark.ray
def test_ray_options_are_planned_shown_refused_and_recorded(tiny_model_dir: Path, tmp_path: Path) -> None:
    import builtins

    import ray

    saved_print = builtins.print  # Ray may patch print process-wide
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        base = ["synth", str(MANIFEST), "--model-dir", str(tiny_model_dir), "--out", str(tmp_path / "o"),
                *FAST_ARGS, "--engine", "ray"]
        dry = CliRunner().invoke(app, [*base, "--ray-actors", "1", "--actor-threads", "1", "--dry-run"])
        assert dry.exit_code == 0 and "ray plan: 1 actors on cpu (fp32), each 1 torch thread" in dry.output, (
            dry.output
        )
        too_many = CliRunner().invoke(app, [*base, "--ray-actors", "500", "--dry-run"])
        assert too_many.exit_code == 2 and "--ray-actors 500 asks for more actors than fit" in too_many.output
        # the run itself: before any model loads
        refused = CliRunner().invoke(app, [*base, "--ray-actors", "500"])
        assert refused.exit_code == 2 and not (tmp_path / "o" / "runs.jsonl").exists(), refused.output
        res = CliRunner().invoke(app, [*base, "--ray-actors", "1", "--actor-threads", "1"])
        assert res.exit_code == 0, res.output
    finally:
        ray.shutdown()
        builtins.print = saved_print
    run = json.loads((tmp_path / "o" / "runs.jsonl").read_text().splitlines()[-1])
    assert run["engine"] == "ray" and run["done"] == 4
    assert (run["ray"]["ray_actors"], run["ray"]["actor_threads"]) == (1, 1)
    assert (run["ray"]["plan"]["actors"], run["ray"]["plan"]["threads"]) == (1, 1)
    assert run["ray"]["plan"]["memory_bytes"] > 0 and run["ray"]["plan"]["nodes"]


def test_ray_options_without_the_ray_engine_are_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["synth", str(MANIFEST), "--model-dir", str(tiny_model_dir), "--out",
                                   str(tmp_path / "o"), *FAST_ARGS, "--ray-actors", "2"])
    assert (
        res.exit_code == 2
        and "--ray-actors sizes the Ray actor pool: give it with --engine ray" in res.output
    )
