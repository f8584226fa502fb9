"""The run folder as a dataset, through the real CLI on a tiny model (subprocesses where a kill or a
resource limit is the point): kill -9 and resume, resume by fingerprint, totals that do not depend
on how the rows were made, one writer per folder, a full disk, and a folder `datasets` loads."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner
from typing_extensions import override

from cosyclone.base import cpu_gemm
from cosyclone.cli import app
from cosyclone.engine import Engine
from cosyclone.engine.batches import plan_batches
from cosyclone.engine.stage_ops import RealOps
from cosyclone.engine.stages import decode_options, finish_batch
from cosyclone.folder.layout import wav_path
from cosyclone.manifest import read_manifest
from cosyclone.options import RunOptions
from cosyclone.run.job import SynthJob
from tests.run_folders import ROOT, diag_lines, diags, samples_per_token

MAX_TOKENS = 6
BASE = ["--device", "cpu", "--max-tokens", str(MAX_TOKENS), "--n-timesteps", "2"]


def write_manifest(folder: Path, n: int, *, name: str = "m.jsonl", long_every: int = 0) -> Path:
    if not (folder / "prompts").exists():
        shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    rows = []
    for i in range(n):
        text = f"row number {i} says hello."
        if long_every and i % long_every == long_every - 1:
            text = " ".join(
                f"Sentence {k} of a long row, long enough to be its own segment." for k in range(4)
            )
        rows.append({"id": f"r{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
                     "prompt_text": "reference words", "text": text})
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli(manifest: Path, model: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(model), "--out", str(out),
                                    *BASE, *extra])


def spawn(manifest: Path, model: Path, out: Path, *extra: str, preexec=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cosyclone.cli", "synth", str(manifest), "--model-dir", str(model),
           "--out", str(out), *BASE, *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec, env={**os.environ, "PYTHONPATH": str(ROOT)})


def journal_lines(out: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in (out / ".cosyclone").glob("journal-*.jsonl"))


def kill_after(proc: subprocess.Popen, out: Path, rows: int, timeout: float = 240.0) -> None:
    """SIGKILL ``proc`` as soon as its journal holds ``rows`` finished rows (it must still be running)."""
    t0 = time.time()
    while journal_lines(out) < rows:
        assert proc.poll() is None, f"the run ended before the kill: {proc.communicate()}"
        assert time.time() - t0 < timeout, "no progress"
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def recount(out: Path) -> dict:
    """Totals counted from the files themselves, not from summary.json."""
    d = diags(out)
    ok = [x for x in d.values() if x["status"] == "ok"]
    return {"rows": len(d), "done": len(ok), "failed": len(d) - len(ok),
            "audio_seconds": pytest.approx(sum(len(sf.read(str(wav_path(out, x['id'])))[0]) / 24000
                                               for x in ok))}


def test_kill_9_mid_run_then_resume_gives_every_row_exactly_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    m = write_manifest(tmp_path, 8, long_every=3)
    out = tmp_path / "out"
    proc = spawn(m, tiny_model_dir, out, "--batch-size", "1")
    kill_after(proc, out, 3)
    assert (out / ".cosyclone" / "lock-all.json").is_file()  # the killed holder's lock is still there

    res = cli(m, tiny_model_dir, out, "--batch-size", "3")
    assert res.exit_code == 0, res.output
    lines = diag_lines(out)
    assert sorted(x["id"] for x in lines) == [f"r{i:02d}" for i in range(8)]  # one line per id
    per_token = samples_per_token(tiny_model_dir)
    for x in lines:
        data, sr = sf.read(str(wav_path(out, x['id'])))
        assert sr == 24000 and len(data) == x["samples"] == sum(x["tokens"]) * per_token
    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in ("rows", "done", "failed", "audio_seconds")} == recount(out)
    assert (
        summary["last_run"]["skipped"] >= 3
        and summary["last_run"]["done"] + summary["last_run"]["skipped"] == 8
    )
    assert not list(out.rglob("*.tmp")) and not list((out / ".cosyclone").glob("journal-*"))
    assert not (out / ".cosyclone" / "lock-all.json").exists()  # the stale lock was taken over, then released
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 1 and runs[0]["argv"]  # the killed run never got to record itself


def test_changed_rows_are_redone_and_counted_by_what_changed(tiny_model_dir: Path, tmp_path: Path) -> None:
    m = write_manifest(tmp_path, 4)
    out = tmp_path / "out"
    assert cli(m, tiny_model_dir, out).exit_code == 0
    first = {x["id"]: x for x in diag_lines(out)}
    rows = [json.loads(x) for x in m.read_text().splitlines()]
    rows[1]["text"] = "a different text now."
    rows[2]["seed"] = 99
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))

    res = cli(m, tiny_model_dir, out)
    assert res.exit_code == 0, res.output
    assert "2 rows redone: " in res.output and "text 1" in res.output and "seed 1" in res.output
    run = json.loads((out / "summary.json").read_text())["last_run"]
    second = diags(out)
    assert sorted(r for r, x in second.items() if x["run_id"] == run["run_id"]) == ["r01", "r02"]
    assert run["redone_by"] == {"text": 1, "seed": 1} and run["skipped"] == 2
    assert second["r02"]["seed"] == 99 and second["r00"] == first["r00"]
    assert len(diag_lines(out)) == 4 + 2  # the redone rows' records appended, the first ones kept

    res = cli(m, tiny_model_dir, out, "--dtype", "bf16")  # a run-wide change redoes every row
    assert res.exit_code == 0, res.output
    run = json.loads((out / "summary.json").read_text())["last_run"]
    assert run["redone_by"] == {"dtype": 4} and run["skipped"] == 0 and "4 rows redone: dtype 4" in res.output
    assert cli(m, tiny_model_dir, out, "--dtype", "bf16").exit_code == 0
    assert json.loads((out / "summary.json").read_text())["last_run"]["skipped"] == 4

    # a row dropped from the manifest is kept and reported
    m.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    res = cli(m, tiny_model_dir, out, "--dtype", "bf16")
    assert "1 rows in the folder are not in this manifest (kept)" in res.output
    assert json.loads((out / "summary.json").read_text())["rows"] == 4

    # linear layers on aten round differently from oneDNN's (the default on CPU builds with oneDNN,
    # which every torch this project installs has)
    assert cpu_gemm.onednn_available()
    res = cli(m, tiny_model_dir, out, "--dtype", "bf16", "--cpu-gemm", "aten")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["last_run"]["redone_by"] == {"options": 3}


@pytest.fixture(scope="module")
def nan_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with NaN injected: one speech-token logit is NaN on every step, and 4% of the
    speech-token embeddings are NaN, so a row that samples one of them gets all-NaN logits next."""
    d = tmp_path_factory.mktemp("nan-model")
    shutil.copytree(tiny_model_dir, d, dirs_exist_ok=True)
    sd = torch.load(d / "llm.pt", weights_only=True)
    sd["llm_decoder.weight"][100] = float("nan")
    sd["speech_embedding.weight"][::25] = float("nan")
    torch.save(sd, d / "llm.pt")
    return d


def report_totals(*folders: Path) -> dict:
    res = CliRunner().invoke(app, ["report", *map(str, folders), "--json"])
    assert res.exit_code == 0, res.output
    totals = json.loads(res.output)
    totals.pop("folders")
    return totals


def test_nan_totals_are_the_same_for_one_run_a_resumed_run_and_four_shards(nan_model: Path,
                                                                          tmp_path: Path) -> None:
    m = write_manifest(tmp_path, 8)
    one = tmp_path / "one"
    res = cli(m, nan_model, one, "--batch-size", "4")
    assert res.exit_code in (0, 3), res.output
    totals = report_totals(one)
    s = totals["sampler"]
    assert s["rows_with_nan"] == 8 and s["calls_with_nan"] == s["sampler_calls"] > 0  # the NaN logit
    # the NaN embeddings
    assert s["rows_all_nan"] >= 1 and totals["failed_reasons"].get("no_finite_logits", 0) >= 1
    summary = json.loads((one / "summary.json").read_text())
    own = ("eval", "versions", "talkers")  # report's own: eval's summary; versions, talkers from runs.jsonl
    assert {k: summary[k] for k in totals if k not in own} == {
        k: v for k, v in totals.items() if k not in own
    }

    resumed = tmp_path / "resumed"
    proc = spawn(m, nan_model, resumed, "--batch-size", "1")
    kill_after(proc, resumed, 3)
    assert cli(m, nan_model, resumed, "--batch-size", "2").exit_code in (0, 3)
    assert report_totals(resumed) == totals

    shards = [tmp_path / f"shard{i}" for i in range(4)]
    for i, folder in enumerate(shards):
        assert cli(m, nan_model, folder, "--shard", f"{i}/4", "--batch-size", "3").exit_code in (0, 3)
    assert report_totals(*shards) == totals

    shared = tmp_path / "shared"  # four shards writing into one folder merge there too
    for i in range(4):
        assert cli(m, nan_model, shared, "--shard", f"{i}/4").exit_code in (0, 3)
    assert report_totals(shared) == totals and len(diag_lines(shared)) == 8


def test_a_second_synth_on_the_same_folder_is_refused_and_the_first_is_unharmed(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    m = write_manifest(tmp_path, 4, long_every=2)
    out = tmp_path / "out"
    first = spawn(m, tiny_model_dir, out, "--batch-size", "1")
    lock = out / ".cosyclone" / "lock-all.json"
    t0 = time.time()
    while not lock.is_file():
        assert first.poll() is None and time.time() - t0 < 120
        time.sleep(0.02)
    second = cli(m, tiny_model_dir, out)
    assert second.exit_code == 5, second.output
    assert f"pid {first.pid} on " in second.output and "started" in second.output
    assert first.poll() is None, "the refusal must not wait for or disturb the first run"
    other_shard = cli(m, tiny_model_dir, out, "--shard", "0/2")  # an overlapping shard is refused as well
    assert other_shard.exit_code == 5
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert sorted(diags(out)) == [f"r{i:02d}" for i in range(4)] and len(diag_lines(out)) == 4


def test_a_full_disk_is_a_clear_error_with_no_torn_file_and_the_rerun_completes(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    m = write_manifest(tmp_path, 4)
    # batches run longest estimate first: the row planned last speaks 4x slower (speed is not in the
    # estimate), so its WAV is the one past the limit, after the others were written
    last = plan_batches(read_manifest(m).rows, 1)[-1][0].id
    rows = [json.loads(x) for x in m.read_text().splitlines()]
    m.write_text("".join(json.dumps({**r, "speed": 0.25} if r["id"] == last else r) + "\n" for r in rows))
    out = tmp_path / "out"
    limit = 20_000  # bytes per file: a short row's PCM16 WAV (~12 kB) fits, one 4x as long does not

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = spawn(m, tiny_model_dir, out, "--batch-size", "1", preexec=small_disk)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 4, stderr
    assert (
        "error: cannot write" in stderr and "File too large" in stderr and "rerun the same command" in stderr
    )
    assert "Traceback" not in stderr and len(stderr.splitlines()) < 15
    assert not list(out.rglob("*.tmp"))  # no torn temporary WAV
    for x in diag_lines(out):
        assert sf.info(str(wav_path(out, x['id']))).frames == x["samples"]
    kept = len(diag_lines(out))
    assert 1 <= kept < 4

    res = cli(m, tiny_model_dir, out, "--batch-size", "1")
    assert res.exit_code == 0, res.output
    assert len(diag_lines(out)) == 4
    assert json.loads((out / "summary.json").read_text())["last_run"]["skipped"] == kept


def test_an_unwritable_out_is_refused_before_the_model_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    # the model's configuration and files, none of them weights: loading fails ("cannot read as a
    # torch checkpoint"), so the refusal below shows that the model did not load first
    unloadable = tmp_path / "unloadable"
    shutil.copytree(tiny_model_dir, unloadable)
    for p in unloadable.glob("*.pt"):
        p.write_text("not weights")
    for p in unloadable.glob("*.onnx"):
        p.write_text("not weights")
    m = write_manifest(tmp_path, 2)
    assert "cannot read as a torch checkpoint" in cli(m, unloadable, tmp_path / "out").output
    (tmp_path / "a-file").write_text("not a folder")
    res = cli(m, unloadable, tmp_path / "a-file" / "out")
    assert res.exit_code == 4 and "is not writable" in res.output, res.output


def test_the_folder_loads_as_an_audiofolder_dataset(tiny_model_dir: Path, tmp_path: Path) -> None:
    import datasets  # a dev dependency: the folder must load with the tool people train from
    m = write_manifest(tmp_path, 3)
    out = tmp_path / "out"
    assert cli(m, tiny_model_dir, out).exit_code == 0
    ds = datasets.load_dataset("audiofolder", data_dir=str(out), split="train")  # decodes with soundfile
    got = {r["id"]: r for r in ds}
    records = diags(out)
    assert sorted(got) == sorted(records)
    for rid, r in got.items():
        audio = r["audio"]
        assert Path(audio["path"]).name == f"{rid}.wav" and r["text"] == records[rid]["text"]
        assert audio["sampling_rate"] == 24000 and len(audio["array"]) == records[rid]["samples"]
        assert r["duration"] == pytest.approx(records[rid]["audio_seconds"]) and r["prompt_audio"]


def test_progress_prints_a_line_per_interval_in_a_log_and_nothing_with_quiet(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    m = write_manifest(tmp_path, 3)
    res = cli(m, tiny_model_dir, tmp_path / "a", "--batch-size", "1", "--progress-interval", "0.1")
    assert res.exit_code == 0, res.output
    lines = [x for x in res.output.splitlines() if x.startswith("synth: ")]
    assert len(lines) >= 2 and lines[-1].startswith("synth: 3/3 rows (100%)")  # ticks, then the final line
    assert all("rows/s" in x and "audio-s/s" in x and "ETA" in x for x in lines)
    rows = [json.loads(x) for x in m.read_text().splitlines()]
    rows[0]["text"] = "changed."
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    quiet = cli(m, tiny_model_dir, tmp_path / "a", "--quiet", "--progress-interval", "0.1")
    assert quiet.exit_code == 0 and "rows redone:" not in quiet.output
    assert not [x for x in quiet.output.splitlines() if x.startswith("synth: ")]
    assert "cosyclone synth" in quiet.output  # the end summary only


class _FailingOps(RealOps):
    """The loaded stages' calls, noting each row the talker decodes in ``decoded``, with a HiFT that
    runs out of memory for a batch holding a row of ``fail`` (code2wav's failure, after the talker)."""

    def __init__(self, engine: _SpyEngine, opts: RunOptions, tokens: Any) -> None:
        stages = engine.stages
        super().__init__(stages, opts, decode_options(stages.cfg, opts, engine.sizing), tokens)
        self.decoded, self.fail = engine.decoded, engine.fail

    @override
    def talk(self, requests: Any, dec: Any) -> Any:
        self.decoded.extend(r.row_id for r in requests)
        return super().talk(requests, dec)

    @override
    def session(self, slots: int) -> Any:
        return _SpySession(super().session(slots), self.decoded)

    @override
    def finish(self, prepared: Any, results: Any) -> Any:
        if any(row.id in self.fail for row in prepared.rows):
            stages = replace(self.stages, hift=cast(Any, _OutOfMemory()))
            return finish_batch(stages, prepared, results, self.opts)
        return super().finish(prepared, results)


class _SpySession:
    """A talker session noting each row added to it (every request the talker decodes is added to
    the run's session); anything else is the session's own."""

    def __init__(self, session: Any, decoded: list[str]) -> None:
        self.session, self.decoded = session, decoded

    def add(self, requests: Any) -> Any:
        self.decoded.extend(r.row_id for r in requests)
        return self.session.add(requests)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


class _OutOfMemory:
    def inference(self, *a: Any, **k: Any) -> Any:
        raise MemoryError("code2wav stub: out of memory")


class _SpyEngine(Engine):
    """The tiny model's engine whose every pipeline runs :class:`_FailingOps`."""

    decoded: list[str]
    fail: set[str]

    @override
    def pipeline(self, **kw: Any) -> Any:
        kw["ops"] = _FailingOps(self, kw.get("opts") or self.opts, kw.get("tokens"))
        return super().pipeline(**kw)


def test_a_row_that_failed_after_the_talker_reuses_its_tokens_on_the_rerun(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The stage-0 checkpoint (.cosyclone/tokens, handoff format): code2wav fails for one row, the
    rerun decodes only what it must and the row gets the tokens a fresh run gives it."""
    m = write_manifest(tmp_path, 3)
    fresh = tmp_path / "fresh"
    assert cli(m, tiny_model_dir, fresh).exit_code == 0

    model: dict[str, Any] = {"device": "cpu", "max_tokens": MAX_TOKENS, "n_timesteps": 2}
    engine = _SpyEngine.load(tiny_model_dir, RunOptions(**model))
    assert isinstance(engine, _SpyEngine)
    engine.decoded, engine.fail = [], {"r01"}
    out = tmp_path / "out"
    summary = SynthJob.open(m, out, loaded=engine, batch_size=1, **model).run()
    assert [r.id for r in summary.failed] == ["r01"]
    assert sorted(engine.decoded) == ["r00", "r01", "r02"]  # the spy sees what the talker decodes
    assert diags(out)["r01"]["status"] == "failed" and "MemoryError" in diags(out)["r01"]["error"]
    kept = list((out / ".cosyclone" / "tokens").glob("*.cch"))
    from cosyclone.folder.fingerprint import token_key

    # only the failed row's, keyed by its fingerprint without the thread count (tokens do not depend on it)
    assert [p.name.rsplit("-", 1)[0] for p in kept] == [token_key(diags(out)["r01"]["fingerprint_parts"])]

    engine.decoded.clear()
    engine.fail.clear()
    summary = SynthJob.open(m, out, loaded=engine, batch_size=1, **model).run()
    assert not summary.failed
    assert "r01" not in engine.decoded  # the talker did not run again for it
    assert json.loads((out / "summary.json").read_text())["last_run"]["talker_checkpoint_hits"] == 1
    again, first = diags(out)["r01"], diags(fresh)["r01"]
    assert again["tokens"] == first["tokens"] and again["stop_reasons"] == first["stop_reasons"]
    assert [s["steps"] for s in again["sampler"]] == [s["steps"] for s in first["sampler"]]
    assert not list((out / ".cosyclone" / "tokens").glob("*.cch"))  # written: checkpoint removed
