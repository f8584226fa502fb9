"""``benchmarks/gpu_check.sh --dry-run`` runs end to end on CPU at tiny sizes: the script parses,
its Python parts (step bench eager vs the graph wrapper, manifest, synth, RTF from summary.json)
run, graphs and eager give the same tokens, and the run records the resolved ``cuda_graphs``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from cosyclone.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "PY": sys.executable, "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "FAILED" not in out, out
    for b in (1, 3):
        assert f"batch {b:3d}: eager" in out and out.count("tokens equal: True") == 2, out
    assert "RTF " in out and "3 rows done, 0 failed" in out and "cuda_graphs off" in out, out
    assert not list(tmp_path.glob("gpu_check.*"))  # the script removed its work folder


def test_synth_rejects_unknown_cuda_graphs_value(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "--load-format", "dummy",
                                   "--cuda-graphs", "on"])
    text = " ".join(res.output.replace("│", " ").split())  # the usage box wraps lines
    assert res.exit_code == 2 and "'--cuda-graphs'" in text and "'on' is not one of 'auto', 'off'" in text, text
