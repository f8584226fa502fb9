"""What a run records of its CUDA graphs is what ran, not what was asked: a run resolved ``on`` whose
rows replayed no graph says so, and every failed capture is listed once."""

from __future__ import annotations

from cosyclone.engine import RowResult
from cosyclone.run.account import RunTally
from cosyclone.talker.diagnostics import SamplerRowDiagnostics


def _row(rid: str, *steps: int) -> RowResult:
    return RowResult(
        id=rid,
        line=1,
        seed=0,
        sampler=tuple(SamplerRowDiagnostics(row_id=rid, seed=0, graph_steps=n) for n in steps),
    )


def test_graphs_used_only_when_some_row_replayed_a_graph() -> None:
    asked_not_run = RunTally()
    for r in (_row("a", 0, 0), _row("b", 0)):
        asked_not_run.add(r)
    assert asked_not_run.graph_rows == 0 and asked_not_run.graph_steps == 0
    ran = RunTally()
    for r in (_row("a", 3, 4), _row("b", 0), _row("c")):
        ran.add(r)
    assert ran.graph_rows == 1 and ran.graph_steps == 7 and ran.done == 3


def test_a_tiny_cpu_run_records_graphs_peak_memory_stage_dtypes_and_sizes(tiny_model_dir, tmp_path) -> None:
    """What ran, not what was asked: CPU has no graphs; the run's peak memory, each stage's dtype and
    the engine's sizes are in runs.jsonl and, equal, in summary.json's last_run."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from cosyclone.cli import app

    root = Path(__file__).resolve().parents[2]
    res = CliRunner().invoke(app, ["synth", str(root / "manifests" / "example.jsonl"), "--model-dir",
                                   str(tiny_model_dir), "--out", str(tmp_path / "o"), "--device", "cpu",
                                   "--max-tokens", "3", "--n-timesteps", "1", "--quiet"])
    assert res.exit_code == 0, res.output
    (line,) = [json.loads(x) for x in (tmp_path / "o" / "runs.jsonl").read_text().splitlines()]
    assert line == json.loads((tmp_path / "o" / "summary.json").read_text())["last_run"]
    assert line["options"]["cuda_graphs"] == "off"  # resolved once: CPU has no graphs
    assert line["cuda_graphs"] == {
        "resolved": "off",
        "used": False,
        "rows_with_graph_steps": 0,
        "graph_steps": 0,
        "capture_errors": [],
    }
    assert line["stage_dtypes"] == {"talker": "fp32", "flow": "fp32", "hift": "fp32"}
    peak = line["peak_memory"]
    # a CPU run: no GPU peak
    assert peak["host_rss_bytes"] > 50 * 2**20 and peak["gpu_allocated_bytes"] is None
    facts = line["engine_facts"]
    assert facts["stage_dtypes"] == line["stage_dtypes"] and facts["peak_memory"]["host_rss_bytes"] > 0
    assert facts["sizing"]["batch_size"] == 8 and facts["sizing"]["sized"] is False  # CPU keeps its defaults
    # decode occupancy on CPU too: every step's bucket holds its live rows, at most the run's slots
    buckets = {int(b): n for b, n in facts["decode_buckets"].items()}
    assert buckets and sum(buckets.values()) == facts["decode_steps"] > 0
    assert 0 < facts["mean_live_slots"] <= max(buckets)
