"""The real CLI on a tiny model directory: outputs, resume, bad-row isolation, shards, determinism."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner, Result

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from cosyclone.folder.row_record import RowRecord
from tests.run_folders import ROOT, diag_lines, diags, samples_per_token, wav_bytes

runner = CliRunner()
MAX_TOKENS = 6


@pytest.fixture()
def model_dir(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


@pytest.fixture()
def manifest(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", tmp_path / "prompts")
    rows = [{"id": f"r{i}", "prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words",
             "text": "hello world " * (i + 1)} for i in range(4)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def synth(manifest: Path, model_dir: Path, out: Path, *extra: str) -> Result:
    return runner.invoke(app, ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out),
                               "--device", "cpu", "--max-tokens", str(MAX_TOKENS), "--n-timesteps", "2",
                               "--batch-size", "2", *extra])


# The fields of a diagnostics line (the record's dataclass, whose table docs/output.md holds), and of each of
# its per-segment sampler records.
ROW_FIELDS = {f.name for f in fields(RowRecord)}
SAMPLER_FIELDS = {
    "row_id",
    "seed",
    "steps",
    "tokens_emitted",
    "stop_reason",
    "nan_steps",
    "all_nan_steps",
    "posinf_steps",
    "no_finite_steps",
    "ras_fallbacks",
    "ras_sole_restores",
    "min_len_suppressed",
    "policy",
    "draw",
    "legacy",
    "error",
}
STOP_REASONS = {"eos", "max_len", "no_finite_logits", "error"}


def test_outputs_are_24k_wavs_of_the_expected_length_with_complete_diagnostics(
        model_dir: Path, manifest: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = synth(manifest, model_dir, out)
    assert res.exit_code == 0, res.output
    assert "bound by" in res.output and "busy of the wall: frontend" in res.output  # the pace, each share
    last = json.loads((out / "summary.json").read_text())["last_run"]
    assert last["stage_seconds"]["bound_by"] in ("frontend", "device")  # talker + code2wav: one device
    assert {"busy", "waiting"} == set(last["stage_seconds"]["talker"]) and last["stage_seconds"]["wall"] > 0
    per_token = samples_per_token(model_dir)
    assert per_token == 2 * 480
    lines = diag_lines(out)
    assert sorted(d["id"] for d in lines) == ["r0", "r1", "r2", "r3"]  # one line per row
    for line in lines:
        rid = line["id"]
        assert set(line) == ROW_FIELDS, set(line) ^ ROW_FIELDS
        assert (
            line["status"] == "ok"
            and line["error"] is None
            and line["file"] == wav_path(out, rid).relative_to(out).as_posix()
        )
        assert isinstance(line["line"], int) and isinstance(line["seed"], int)
        n_seg = len(line["stop_reasons"])
        assert n_seg >= 1 and len(line["tokens"]) == n_seg and len(line["sampler"]) == n_seg
        assert set(line["stop_reasons"]) <= STOP_REASONS
        assert {"frontend", "talker", "flow", "hift"} <= set(line["seconds"])
        assert all(v >= 0 for v in line["seconds"].values())
        for seg in line["sampler"]:
            assert set(seg) >= SAMPLER_FIELDS, SAMPLER_FIELDS - set(seg)
            assert (
                seg["row_id"] == rid
                and seg["steps"] >= 1
                and seg["policy"] == "exclude"
                and not seg["legacy"]
            )
        assert all(0 < t <= MAX_TOKENS for t in line["tokens"])
        assert len(line["segments"]) == len(line["tokens"])  # what the LLM read, per segment
        assert all(seg["text"] and seg["text_ids"] > 0 and seg["prompt_ids"] > 0 for seg in line["segments"])
        info = sf.info(str(wav_path(out, rid)))
        assert info.samplerate == 24000 and info.channels == 1 and info.subtype == "PCM_16"
        data, sr = sf.read(str(wav_path(out, rid)))
        assert len(data) == sum(line["tokens"]) * per_token  # each segment: tokens x 2 mel frames x 480
        assert line["audio_seconds"] == pytest.approx(len(data) / 24000)
        assert np.isfinite(data).all() and np.abs(data).max() > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 4 and summary["failed"] == 0 and summary["last_run"]["invalid"] == 0
    assert summary["audio_seconds"] == pytest.approx(sum(d["audio_seconds"] for d in lines))
    assert (
        summary["nan_summary"]
        == f"{sum(s['steps'] for d in lines for s in d['sampler'])} sampler calls, 0 entirely NaN"
    )
    for key in ("versions", "model_yaml_sha256", "options", "throughput_audio_s_per_s", "rtf", "model_hash"):
        assert summary["last_run"][key] is not None
    assert summary["last_run"]["options"]["max_tokens"] == MAX_TOKENS
    assert summary["last_run"]["options"]["n_timesteps"] == 2


def test_resume_after_a_kill_redoes_exactly_the_missing_rows(model_dir: Path, manifest: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert synth(manifest, model_dir, out).exit_code == 0
    first = wav_bytes(out)
    log = out / "diagnostics.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert len(lines) == 4  # a first run: one record per row
    torn = json.loads(lines[-1])["id"]  # the kill cut this row's line in half
    gone = json.loads(lines[0])["id"]  # this row's WAV is lost
    log.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    wav_path(out, gone).unlink()

    res = synth(manifest, model_dir, out)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    run = summary["last_run"]
    assert run["skipped"] == 2 and run["done"] == 2 and summary["done"] == 4 and summary["failed"] == 0
    redone = sorted(rid for rid, d in diags(out).items() if d["run_id"] == run["run_id"])
    assert redone == sorted({torn, gone})
    assert wav_bytes(out) == first  # the redone rows come out byte-identical
    assert all(d["status"] == "ok" for d in diags(out).values()) and len(diags(out)) == 4
    # appended, never rewritten: the whole first lines, then the redone rows
    assert len(diag_lines(out)) == 3 + 2

    # nothing left to do: no model work, the same records
    before = log.read_text()
    res = synth(manifest, model_dir, out)
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["last_run"]["skipped"] == 4
    assert log.read_text() == before


def test_reruns_with_the_same_seed_are_byte_identical(
    model_dir: Path, manifest: Path, tmp_path: Path
) -> None:
    assert synth(manifest, model_dir, tmp_path / "a", "--seed", "11").exit_code == 0
    first = wav_bytes(tmp_path / "a")
    assert len(first) == 4
    assert synth(manifest, model_dir, tmp_path / "a", "--seed", "11", "--overwrite").exit_code == 0
    assert wav_bytes(tmp_path / "a") == first
    assert synth(manifest, model_dir, tmp_path / "b", "--seed", "11").exit_code == 0
    assert wav_bytes(tmp_path / "b") == first

    def stable(out: Path) -> dict:
        return {k: {f: v for f, v in d.items() if f not in ("seconds", "finished_at", "run_id")}
                for k, d in diags(out).items()}

    assert stable(tmp_path / "b") == stable(tmp_path / "a")
    assert synth(manifest, model_dir, tmp_path / "c", "--seed", "12").exit_code == 0
    assert {k: d["seed"] for k, d in diags(tmp_path / "c").items()} != {k: d["seed"] for k, d in
                                                                      diags(tmp_path / "a").items()}


def test_bad_rows_isolated(model_dir: Path, manifest: Path, tmp_path: Path) -> None:
    good = {"prompt_audio": "prompts/speaker1.wav", "prompt_text": "reference words", "text": "fine"}
    bad_rows = [
        "",  # line 5: blank lines count in the numbering but are not rows
        json.dumps({"id": "u", **good, "colour": "red"}),  # 6
        json.dumps({"id": "r1", **good}),  # 7: duplicate id
        json.dumps({"id": "m", **good, "prompt_audio": "prompts/nope.wav"}),  # 8: missing audio
        json.dumps({"id": "../x", **good}),  # 9: unsafe id
        json.dumps({"id": "s", **good, "speed": 9}),  # 10: speed out of range
        "{broken",  # 11
    ]
    with manifest.open("a") as fh:
        fh.write("".join(x + "\n" for x in bad_rows))
    expected = [("line 6", "field 'colour'"), ("line 7", "field 'id'"), ("line 8", "field 'prompt_audio'"),
                ("line 9", "field 'id'"), ("line 10", "field 'speed'"), ("line 11", "invalid JSON")]
    out = tmp_path / "out"
    res = synth(manifest, model_dir, out)
    assert res.exit_code == 3, res.output
    errors = [x for x in res.stderr.splitlines() if ": line " in x]
    assert len(errors) == len(expected), res.stderr
    for (where, what), msg in zip(expected, errors, strict=True):
        assert where + "," in msg or where + ":" in msg, msg
        assert what in msg, msg
    assert "first used on line 2" in errors[1] and "nope.wav" in errors[2] and "'..'" in errors[3]
    assert sorted(wav_bytes(out)) == ["r0.wav", "r1.wav", "r2.wav", "r3.wav"]
    assert sorted(diags(out)) == ["r0", "r1", "r2", "r3"]
    assert not (out / "x.wav").exists() and not (tmp_path / "x.wav").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["done"] == 4
        and summary["last_run"]["invalid"] == 6
        and len(summary["last_run"]["invalid_rows"]) == 6
    )
    assert diags(out)["r1"]["line"] == 2  # the first occurrence of a duplicate id is the one kept

    val = runner.invoke(app, ["validate", str(manifest)])
    assert val.exit_code == 3 and "4 valid rows, 6 rejected" in val.output
    assert [x.split(": ", 1)[1] for x in val.output.splitlines() if ": line " in x] == \
        [x.split(": ", 1)[1] for x in errors]


def test_shards_disjoint_and_covering(model_dir: Path, manifest: Path, tmp_path: Path) -> None:
    with manifest.open("a") as fh:
        fh.write(json.dumps({"id": "r4", "prompt_audio": "prompts/speaker2.wav",
                             "prompt_text": "I recorded this sentence for you.", "text": "shard me"}) + "\n")
        fh.write("{not json\n")  # an invalid line belongs to exactly one shard too
    for n in (2, 3):
        got: list[str] = []
        invalid = 0
        for i in range(n):
            out = tmp_path / f"s{n}-{i}"
            res = synth(manifest, model_dir, out, "--shard", f"{i}/{n}")
            assert res.exit_code in (0, 3), res.output
            got += sorted(diags(out))
            assert sorted(p.stem for p in (out / "wavs").rglob("*.wav")) == sorted(diags(out))
            summary = json.loads((out / "summary.json").read_text())
            invalid += summary["last_run"]["invalid"]
            assert summary["last_run"]["shard"] == f"{i}/{n}"
        assert sorted(got) == ["r0", "r1", "r2", "r3", "r4"] and len(set(got)) == len(got)
        assert invalid == 1
    assert synth(manifest, model_dir, tmp_path / "x", "--shard", "2/2").exit_code == 2


def test_speed_and_seed_fields_accepted(model_dir: Path, manifest: Path, tmp_path: Path) -> None:
    rows = [
        {
            "id": "slow",
            "prompt_audio": "prompts/speaker2.wav",
            "prompt_text": "I recorded this sentence for you.",
            "text": "hello there",
            "speed": 0.8,
        },
        {
            "id": "fast",
            "prompt_audio": "prompts/speaker3.wav",
            "prompt_text": "",
            "text": "hello there",
            "mode": "cross_lingual",
            "speed": 1.25,
            "seed": 42,
        },
    ]
    path = manifest.parent / "speed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    res = synth(path, model_dir, out)
    assert res.exit_code == 0, res.output
    d = diags(out)
    assert d["slow"]["status"] == "ok" and d["fast"]["status"] == "ok" and d["fast"]["seed"] == 42
    for k, speed in (("slow", 0.8), ("fast", 1.25)):  # speed resamples each segment's mel to int(2n/speed)
        want = sum(int(2 * n / speed) * 480 for n in d[k]["tokens"])
        assert sf.info(str(wav_path(out, k))).frames == want > 0, (k, d[k]["tokens"])


def test_example_manifest_with_min_tokens_and_token_budget(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = runner.invoke(
        app,
        [
            "synth",
            str(ROOT / "manifests" / "example.jsonl"),
            "--model-dir",
            str(model_dir),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--max-tokens",
            "4",
            "--min-tokens",
            "4",
            "--n-timesteps",
            "2",
            "--token-budget",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    d = diags(out)
    assert sorted(d) == ["crossling", "hello", "instruct", "weather"]
    for line in d.values():
        assert line["status"] == "ok" and set(line["stop_reasons"]) == {"max_len"}
        assert all(s["steps"] == 4 for s in line["sampler"]), line  # min = max: exactly 4 tokens sampled
    assert d["weather"]["seed"] == 7
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["last_run"]["options"]["min_tokens"] == 4
        and summary["last_run"]["options"]["token_budget"] == 1
    )


def test_validate_and_dry_run(model_dir: Path, manifest: Path, tmp_path: Path) -> None:
    assert runner.invoke(app, ["validate", str(manifest)]).exit_code == 0
    res = synth(manifest, model_dir, tmp_path / "o", "--dry-run")
    assert res.exit_code == 0 and "4 valid rows" in res.output
    assert "bound by " in res.output and "rows/s" in res.output  # the projected bounding stage
    assert runner.invoke(app, ["validate", str(tmp_path / "nope.jsonl")]).exit_code == 2


def test_inspect_checks_keys_the_way_stages_load_them(model_dir: Path, tmp_path: Path) -> None:
    ok = runner.invoke(app, ["inspect", str(model_dir)])
    assert ok.exit_code == 0, ok.output
    assert ok.output.count("keys ok") == 3  # hift.pt carries `generator.` + weight-norm keys: adapted

    import torch

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    state = torch.load(broken / "flow.pt", weights_only=True)
    state.pop("input_embedding.weight")
    torch.save(state, broken / "flow.pt")
    bad = runner.invoke(app, ["inspect", str(broken)])
    assert bad.exit_code == 2
    assert "missing (1): input_embedding.weight" in bad.output


def test_dummy_run_without_model_dir_gets_builtin_frontend_assets(manifest: Path) -> None:
    from cosyclone.frontend import Frontend
    from cosyclone.frontend.tiny_assets import builtin_assets_dir
    from cosyclone.model.config import released_config

    root = builtin_assets_dir()
    assert builtin_assets_dir() == root  # written once (per user, in the cache folder)
    cfg = released_config()
    from dataclasses import replace

    frontend = Frontend(replace(cfg, model_dir=root))
    row = json.loads(manifest.read_text().splitlines()[0])
    requests = frontend.prepare(row["id"], manifest.parent / row["prompt_audio"], row.get("prompt_text"),
                                row["text"], row.get("mode", "zero_shot"), row.get("instruct"), 0, 1.0)
    assert requests and requests[0].embed["embedding"].shape[-1] == cfg.frontend.spk_embed_dim


def test_validate_and_the_builtin_assets_leave_no_temporary_folder(manifest: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """validate without --model-dir and dummy runs use the built-in frontend assets: written once into
    the user cache folder (whole, by a rename), never into a temporary folder left behind."""
    import tempfile

    from cosyclone.frontend.tiny_assets import builtin_assets_dir

    scratch, cache = tmp_path / "tmp", tmp_path / "cache"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setenv("COSYCLONE_CACHE_DIR", str(cache))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    res = CliRunner().invoke(app, ["validate", str(manifest), "--show-text"])
    assert res.exit_code == 0, res.output
    root = builtin_assets_dir()
    assert root.parent == cache and [p.name for p in cache.glob("builtin-*")] == [root.name]
    assert list(scratch.iterdir()) == []
