"""``--engine ray`` on a cluster of two nodes built on this machine (``ray.cluster_utils.Cluster``: two
raylets, one CPU each, their own workers), as two machines without shared prompt storage would run it.

The prompts are moved away once the driver has read them and before any actor starts, so an actor
that opened a prompt by its path would fail the row: every row coming out right proves the prompts
travelled with the tasks. Each node gets an actor (the plan's placement), every row is produced once,
and the folder equals a local run's at the actors' thread count. A SIGTERM to such a driver stops
the run gracefully, stops its actors, and the rerun completes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from cosyclone.cli import app
from tests.ray.test_ray_engine import TIMING, wav_bits
from tests.ray_hooks import PID_FILE_ENV, task_starts
from tests.run.test_graceful_stop import assert_folder_whole, signal_after
from tests.run_folders import ROOT, diag_lines, diags

pytestmark = pytest.mark.ray

N_ROWS, BATCH = 8, 2
ARGS = [
    "--device",
    "cpu",
    "--max-tokens",
    "6",
    "--n-timesteps",
    "2",
    "--float-wav",
    "--batch-size",
    str(BATCH),
    "--seed",
    "5",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """Two nodes of one CPU each, the driver (this process) connected; workers record their task starts."""
    import builtins

    import ray
    from ray.cluster_utils import Cluster

    saved_print, saved_env = builtins.print, dict(os.environ)
    pid_file = tmp_path_factory.mktemp("nodes") / "starts.txt"
    os.environ[PID_FILE_ENV] = str(pid_file)  # before the nodes start: their workers inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 100 * 2**20,
                                                          "include_dashboard": False})
    nodes.add_node(num_cpus=1, object_store_memory=100 * 2**20)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "tests.ray_hooks.record_task_starts"})
    try:
        yield nodes, pid_file
    finally:
        ray.shutdown()
        nodes.shutdown()
        builtins.print = saved_print
        os.environ.clear()
        os.environ.update(saved_env)


def write_rows(folder: Path, n: int) -> Path:
    shutil.copytree(ROOT / "manifests" / "prompts", folder / "prompts")
    texts = ("hi there", "a longer sentence, with a comma in it", "medium text", "one more of another size")
    rows = [
        {
            "id": f"n{i:02d}",
            "prompt_audio": f"prompts/speaker{i % 3 + 1}.wav",
            "prompt_text": "reference words",
            "text": texts[i % len(texts)] + f" number {i}",
        }
        for i in range(n)
    ]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "m.jsonl"


def synth(manifest: Path, model: Path, out: Path, *extra: str) -> None:
    res = CliRunner().invoke(
        app, ["synth", str(manifest), "--model-dir", str(model), "--out", str(out), *ARGS, *extra]
    )
    assert res.exit_code == 0, res.output


def test_actors_on_both_nodes_write_a_local_runs_bytes_without_the_prompt_files(
    cluster: tuple[Any, Path], tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from cosyclone.ray import pool as ray_pool

    _, pid_file = cluster
    manifest = write_rows(tmp_path, N_ROWS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # each node's one CPU holds one actor of one torch thread (ray_plan's rule)
    try:
        synth(manifest, tiny_model_dir, tmp_path / "local")
    finally:
        torch.set_num_threads(threads)

    grow = ray_pool.ActorPool._grow

    def prompts_gone_then_grow(pool: ray_pool.ActorPool) -> None:
        """Every prompt of the part is read and put by now; no actor exists yet."""
        if (tmp_path / "prompts").exists():
            (tmp_path / "prompts").rename(tmp_path / "elsewhere")
        grow(pool)

    monkeypatch.setattr(ray_pool.ActorPool, "_grow", prompts_gone_then_grow)
    pid_file.write_text("")
    t0 = time.perf_counter()
    synth(manifest, tiny_model_dir, tmp_path / "ray", "--engine", "ray")
    print(f"two-node Ray run: {time.perf_counter() - t0:.1f} s")
    assert not (tmp_path / "prompts").exists()

    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    starts = task_starts(pid_file)
    assert len(nodes) == 2 and {node for _, node in starts} == nodes  # tasks ran on both nodes
    record = json.loads((tmp_path / "ray" / "runs.jsonl").read_text().splitlines()[-1])["ray"]
    assert sorted(record["placed"]) == sorted(nodes) and record["plan"]["actors"] == 2  # one actor per node
    lines = diag_lines(tmp_path / "ray")
    assert sorted(d["id"] for d in lines) == [f"n{i:02d}" for i in range(N_ROWS)]  # every row once
    assert all(d["status"] == "ok" for d in lines)
    assert wav_bits(tmp_path / "ray") == wav_bits(tmp_path / "local")
    same = {k: {f: v for f, v in d.items() if f not in TIMING} for k, d in diags(tmp_path / "local").items()}
    assert {
        k: {f: v for f, v in d.items() if f not in TIMING} for k, d in diags(tmp_path / "ray").items()
    } == same


def test_sigterm_stops_a_ray_run_and_its_actors_and_the_rerun_completes(
    cluster: tuple[Any, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    import ray

    nodes, _ = cluster
    manifest = write_rows(tmp_path, 24)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "cosyclone.cli", "synth", str(manifest), "--model-dir", str(tiny_model_dir),
           "--out", str(out), *ARGS, "--engine", "ray", "--ray-address", nodes.address, "--grace", "20"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seconds, _, stderr = signal_after(proc, out, 2, signal.SIGTERM)
    print(f"Ray SIGTERM: exit {proc.returncode} {seconds:.1f} s after the signal")

    assert proc.returncode == 143, stderr
    assert seconds < 20 + 5
    done = assert_folder_whole(out)
    assert 2 <= len(done) < 24
    run = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    assert run["stopped_by"] == "SIGTERM" and run["engine"] == "ray"
    assert "interrupted by SIGTERM" in stderr.strip().splitlines()[-1]
    from ray._private.state import actors

    alive = [a for a in actors().values() if a["ActorClassName"] == "SynthActor" and a["State"] != "DEAD"]
    assert alive == []  # the driver stopped its actors

    again = subprocess.run(cmd[:-2], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert sorted(d["id"] for d in assert_folder_whole(out)) == [f"n{i:02d}" for i in range(24)]
    assert ray.is_initialized()
