"""``--engine ray`` on a local 2-CPU Ray cluster, through the real CLI on the tiny model.

The local engine's output is the reference (at the actors' thread count, see ``local_out``): the same manifest
gives the same audio bits (float WAVs, so every sample bit counts; compared as samples, since libsndfile
stamps the write time into a float WAV's PEAK chunk) and the same diagnostics and totals; a worker killed
mid-batch costs nothing (each row written exactly once, same bytes); a rerun redoes only what is missing. One
Ray session serves the module (its start is the slow part); each run builds its own actor pool.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from tests.ray_hooks import PID_FILE_ENV, task_starts
from tests.run_folders import ROOT, diag_lines, diags

pytestmark = pytest.mark.ray

N_ROWS, BATCH = 12, 4
TEXTS = ("hi there", "a longer sentence, with a comma in it", "medium text", "one more of another size")
TIMING = ("seconds", "finished_at", "run_id")  # record fields of the invocation, not of the row's result
SUMMARY_RESULTS = ("rows", "done", "failed", "failed_reasons", "sampler", "nan_summary",
                   "nonfinite_audio_rows", "nonfinite_audio_samples", "audio_seconds")
RUN_RESULTS = ("done", "skipped", "failed", "invalid")  # last_run counts


@pytest.fixture(scope="module")
def ray_pid_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray cluster of 2 CPUs for the module; its workers append their pid per batch to the file."""
    import builtins

    import ray

    saved_print = builtins.print  # Ray may patch print process-wide; the rest of the session needs it
    pid_file = tmp_path_factory.mktemp("ray") / "pids.txt"
    old = os.environ.get(PID_FILE_ENV)
    os.environ[PID_FILE_ENV] = str(pid_file)  # before ray.init: the workers inherit the environment
    # tests.*
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "tests.ray_hooks.record_task_starts"})
    try:
        yield pid_file
    finally:
        ray.shutdown()
        builtins.print = saved_print
        if old is None:
            os.environ.pop(PID_FILE_ENV, None)
        else:
            os.environ[PID_FILE_ENV] = old


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("manifest")
    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    rows = [{"id": f"row{i:02d}", "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
             "prompt_text": "reference words " * (i % 4 + 1), "text": TEXTS[i % len(TEXTS)] + f" number {i}"}
            for i in range(N_ROWS)]
    path = folder / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(manifest: Path, model_dir: Path, out: Path) -> list[str]:
    """The short synth run every test here makes (the engine chosen apart)."""
    return ["synth", str(manifest), "--model-dir", str(model_dir), "--out", str(out), "--device", "cpu",
            "--max-tokens", "6", "--n-timesteps", "2", "--float-wav", "--batch-size", str(BATCH),
            "--seed", "3"]


def _synth(manifest: Path, model_dir: Path, out: Path, engine: str) -> str:
    res = CliRunner().invoke(app, [*_args(manifest, model_dir, out), "--engine", engine])
    assert res.exit_code == 0, res.output
    return res.output


def wav_bits(out: Path) -> dict[str, bytes]:
    """Each WAV's samples, bit for bit (float32), and its sample rate."""
    import soundfile as sf

    found = {}
    for p in sorted((out / "wavs").rglob("*.wav")):
        data, sr = sf.read(str(p), dtype="float32")
        found[p.name] = f"{sr}:".encode() + data.tobytes()
    return found


def _results(out: Path) -> dict[str, dict]:
    return {rid: {k: v for k, v in d.items() if k not in TIMING} for rid, d in diags(out).items()}


def _summary(out: Path) -> dict:
    s = json.loads((out / "summary.json").read_text())
    return {**{k: s[k] for k in SUMMARY_RESULTS}, **{k: s["last_run"][k] for k in RUN_RESULTS}}


def planned_threads(model_dir: Path) -> int:
    """The torch threads of each CPU actor the Ray run plans on the module's cluster (ray_plan's rule)."""
    import ray
    import torch

    from cosyclone.base.device import DevicePolicy
    from cosyclone.model.config import load_model_config
    from cosyclone.ray.cluster import read_cluster
    from cosyclone.ray.plan import plan_run

    cpu = DevicePolicy(device=torch.device("cpu"), dtype=torch.float32, backend="cpu")
    plan = plan_run(load_model_config(model_dir), cpu, BATCH, read_cluster(ray))
    assert plan.refusal is None and plan.threads is not None, plan.describe()
    return plan.threads


@pytest.fixture(scope="module")
def local_out(ray_pid_file: Path, manifest: Path, tiny_model_dir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local engine at the actors' torch thread count: on CPU, fp32 bytes depend on the count
    (1 and 2 threads differ in the last bits, for the local engine alone), never on the batch's process."""
    import torch

    out = tmp_path_factory.mktemp("local") / "out"
    threads = torch.get_num_threads()
    torch.set_num_threads(planned_threads(tiny_model_dir))  # what each actor runs (ray_plan's rule)
    try:
        _synth(manifest, tiny_model_dir, out, "local")
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def ray_out(ray_pid_file: Path, manifest: Path, tiny_model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ray") / "out"
    _synth(manifest, tiny_model_dir, out, "ray")
    return out


def test_ray_engine_gives_the_local_engines_bytes_diagnostics_and_totals(local_out: Path, ray_out: Path,
                                                                        ray_pid_file: Path) -> None:
    local, ray = wav_bits(local_out), wav_bits(ray_out)
    assert len(local) == N_ROWS and local == ray
    assert _results(ray_out) == _results(local_out)  # status, tokens, seeds, stop reasons, sampler counters
    assert all(d["status"] == "ok" for d in _results(ray_out).values())
    assert len(diag_lines(ray_out)) == N_ROWS  # each row written once
    assert _summary(ray_out) == _summary(local_out)
    starts = [pid for pid, _ in task_starts(ray_pid_file)]
    assert len(starts) == N_ROWS // BATCH and os.getpid() not in starts  # each batch once, in an actor


def test_rerun_redoes_nothing_then_exactly_the_missing_rows(ray_out: Path, local_out: Path, manifest: Path,
                                                           tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(ray_out, out)
    before = (out / "diagnostics.jsonl").read_bytes()
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "wavs").rglob("*.wav")}
    _synth(manifest, tiny_model_dir, out, "ray")
    assert (out / "diagnostics.jsonl").read_bytes() == before  # not a line added
    assert {p.name: p.stat().st_mtime_ns for p in (out / "wavs").rglob("*.wav")} == mtimes
    run = json.loads((out / "summary.json").read_text())["last_run"]
    assert (run["skipped"], run["done"]) == (N_ROWS, 0)

    lost = ["row01", "row06", "row11"]  # as if the cluster died before these were written
    for rid in lost:
        wav_path(out, rid).unlink()
    _synth(manifest, tiny_model_dir, out, "ray")
    run_id = json.loads((out / "summary.json").read_text())["last_run"]["run_id"]
    assert sorted(d["id"] for d in diag_lines(out) if d["run_id"] == run_id) == lost
    assert len(diag_lines(out)) == N_ROWS + len(lost)  # the redone rows' records appended
    # the rows not redone keep their bits; the redone ones ran as one new batch of three, so they
    # equal the local engine's only up to batch-size float rounding (tests/pcm16.py)
    again, local = wav_bits(out), wav_bits(local_out)
    assert {k: v for k, v in again.items() if k[:-4] not in lost} == {k: v for k, v in local.items()
                                                                      if k[:-4] not in lost}
    for rid in lost:
        x = np.frombuffer(again[f"{rid}.wav"][6:], np.float32)
        y = np.frombuffer(local[f"{rid}.wav"][6:], np.float32)
        assert x.shape == y.shape and float(np.abs(x - y).max()) < 1e-4  # a wrong token moves samples by ~0.1


def test_a_worker_killed_mid_batch_loses_no_row_and_writes_none_twice(ray_pid_file: Path, local_out: Path,
                                                                     manifest: Path, tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    ray_pid_file.write_text("")
    killed: list[int] = []
    stop = threading.Event()

    def kill_first_worker() -> None:  # SIGKILL the first actor the moment it starts a batch
        while not stop.is_set():
            starts = task_starts(ray_pid_file)
            if starts:
                os.kill(starts[0][0], signal.SIGKILL)
                killed.append(starts[0][0])
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_first_worker, daemon=True)
    killer.start()
    try:
        _synth(manifest, tiny_model_dir, tmp_path / "out", "ray")
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 1
    starts = Counter(pid for pid, _ in task_starts(ray_pid_file))
    assert starts[killed[0]] == 1  # the killed process never ran another batch
    assert sum(starts.values()) == N_ROWS // BATCH + 1  # its batch ran again elsewhere, the others once
    lines = diag_lines(tmp_path / "out")
    assert sorted(d["id"] for d in lines) == sorted(diags(local_out))  # every row exactly once
    assert all(d["status"] == "ok" for d in lines)
    assert wav_bits(tmp_path / "out") == wav_bits(local_out)


def test_without_ray_installed_engine_ray_says_how_to_install_it(manifest: Path, tiny_model_dir: Path,
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    res = CliRunner().invoke(app, ["synth", str(manifest), "--model-dir", str(tiny_model_dir),
                                   "--out", str(tmp_path / "out"), "--engine", "ray"])
    assert res.exit_code == 2
    assert "pip install -e '.[ray]'" in res.output
    assert not (tmp_path / "out").exists()  # nothing was started


def test_rows_travel_as_plain_json_data_and_come_back_equal(manifest: Path) -> None:
    from cosyclone.manifest import read_manifest
    from cosyclone.ray.pool import row_from_dict, row_to_dict

    rows = read_manifest(manifest).rows
    rows += [replace(rows[0], id="seeded", seed=7, speed=1.25)]
    back = [row_from_dict(d) for d in json.loads(json.dumps([row_to_dict(r) for r in rows]))]
    assert back == rows and isinstance(back[0].prompt_audio, Path)


def test_the_runs_actors_follow_the_plan(ray_pid_file: Path, tiny_model_dir: Path) -> None:
    """On this 2-CPU cluster the rule's plan for the tiny model: as many actors as the threads allow,
    half a CPU per thread asked, the footprint asked as Ray memory."""
    import ray

    from cosyclone.ray.cluster import read_cluster
    from cosyclone.ray.plan import CPU_SHARE, DEFAULT_CPU_THREADS

    threads = planned_threads(tiny_model_dir)
    (node,) = read_cluster(ray)
    assert node.cpus == 2.0 and threads == DEFAULT_CPU_THREADS
    assert CPU_SHARE * threads * (2 // threads) <= 1.0  # at least one CPU stays free for the driver and Ray


def test_an_actor_switches_tf32_off_in_its_own_process(monkeypatch: pytest.MonkeyPatch,
                                                       tiny_model_dir: Path) -> None:
    """The driver's resolve() sets the no-TF32 switches for its process only; each actor sets its own."""
    import torch

    from cosyclone.engine.setup import model_config
    from cosyclone.options import RunOptions
    from cosyclone.ray import actor as ray_actor

    opts = RunOptions(device="cpu")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # a fresh process's default
    actor = ray_actor.SynthActor(model_config(tiny_model_dir, opts.load_format), None, opts, None)  # type: ignore[arg-type]
    assert actor.load_error is None
    assert torch.backends.cudnn.allow_tf32 is False


def test_a_model_that_does_not_load_in_the_actors_stops_the_run_as_locally(ray_pid_file: Path, manifest: Path,
                                                                          tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    bad = tmp_path / "model"
    shutil.copytree(tiny_model_dir, bad)
    (bad / "flow.pt").write_bytes(b"not a checkpoint")
    one = tmp_path / "one.jsonl"
    one.write_text(
        manifest.read_text().splitlines()[0].replace('"prompts/', f'"{manifest.parent}/prompts/') + "\n"
    )
    res = CliRunner().invoke(app, ["synth", str(one), "--model-dir", str(bad), "--out", str(tmp_path / "out"),
                                   "--device", "cpu", "--engine", "ray"])
    assert res.exit_code == 2, res.output
    assert "flow.pt: cannot read as a torch checkpoint" in res.output
    from tests.every_record import read_records

    assert read_records(tmp_path / "out") == {}  # no row written (journal or diagnostics)


def test_print_is_still_the_builtin_after_the_ray_runs(ray_out: Path) -> None:
    """Ray's tqdm patches builtins.print in the driver on the first worker log line (the kill above makes
    one); run_ray keeps ours. Last in the module on purpose."""
    import builtins

    assert builtins.print.__module__ == "builtins", builtins.print.__module__


def test_ray_actors_read_and_keep_the_folders_token_checkpoint(
    ray_pid_file: Path,
    local_out: Path,
    manifest: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local run whose code2wav failed leaves every row's tokens in OUT/.cosyclone/tokens; the Ray rerun's
    actors (continuous schedule) take them from there instead of decoding again, and write the local bytes.
    The local run is at the actors' torch threads: the count changes a CPU row's last bits."""
    import torch

    from cosyclone.engine import stages

    out = tmp_path / "out"

    def broken(*args, **kwargs):
        raise RuntimeError("code2wav down")

    threads = torch.get_num_threads()
    torch.set_num_threads(planned_threads(tiny_model_dir))
    try:
        with monkeypatch.context() as m:
            m.setattr(stages, "_code2wav", broken)
            res = CliRunner().invoke(app, _args(manifest, tiny_model_dir, out))
    finally:
        torch.set_num_threads(threads)
    assert res.exit_code == 3, res.output
    kept = sorted((out / ".cosyclone" / "tokens").glob("*.cch"))
    assert len(kept) == N_ROWS  # one segment per row, each kept for the rerun
    _synth(manifest, tiny_model_dir, out, "ray")  # --schedule continuous, the default
    last = json.loads((out / "summary.json").read_text())["last_run"]
    assert last["talker_checkpoint_hits"] == N_ROWS and last["options"]["schedule"] == "continuous"
    assert wav_bits(out) == wav_bits(local_out)
    assert not list((out / ".cosyclone" / "tokens").glob("*.cch"))  # written rows' tokens are tidied


def test_ray_tasks_follow_the_schedule() -> None:
    from cosyclone.ray.pool import task_groups

    assert task_groups(5, 2, "static") == [[0], [1], [2], [3], [4]]
    assert task_groups(9, 2, "continuous") == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert sum(task_groups(7, 3, "continuous"), []) == list(range(7))  # every batch once, in plan order
