"""The page's run history reads runs.jsonl lines of every version by field name."""

from __future__ import annotations

import json
from pathlib import Path

from cosyclone.report.history import bounding_stage, read_history, run_line


def test_a_run_line_shows_its_rates_device_and_peaks() -> None:
    line = run_line(
        "out",
        {
            "started_at": 0,
            "done": 9,
            "failed": 1,
            "skipped": 2,
            "rows_per_s": 1.5,
            "throughput_audio_s_per_s": 4.25,
            "device": "cuda",
            "dtype": "mixed",
            "devices": ["NVIDIA H100"],
            "shard": "0/2",
            "stopped_by": "SIGTERM",
            "peak_memory": {"host_rss_bytes": 3_000_000_000, "gpu_allocated_bytes": None},
        },
    )
    assert (line.started, line.done, line.failed, line.skipped) == ("1970-01-01 00:00", 9, 1, 2)
    assert line.device == "cuda mixed (NVIDIA H100)" and line.peak_memory == "host 3.00 GB"
    assert (line.shard, line.stopped_by, line.bound_by) == ("0/2", "SIGTERM", "-")


def test_the_bounding_stage_is_read_where_the_run_record_keeps_it() -> None:
    assert bounding_stage({"stage_seconds": {"bound_by": "code2wav", "wall": 3.0}}) == "code2wav"
    assert bounding_stage({"stage_seconds": {"bound_by": None}}) == "-"  # a run too short to say
    assert bounding_stage({"rows": 3}) == "-"  # a record from before runs carried it


def test_an_old_or_torn_line_reads_as_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "runs.jsonl").write_text(
        json.dumps({"started_at": 5, "done": 1}) + "\n{torn", encoding="utf-8"
    )
    (runs,) = read_history([tmp_path])
    assert runs.done == 1 and runs.device == "-" and runs.peak_memory == "-" and runs.rows_per_s == 0.0
