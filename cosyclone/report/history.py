"""The run history of the folders: one row per invocation, read from each folder's ``runs.jsonl``.

Lines are read by field name with defaults, so lines of older versions (and fields a newer version
adds, such as the stage that bounded the run) show what they hold and ``-`` for the rest.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyclone.folder.layout import RUNS_NAME, iter_jsonl
from cosyclone.folder.totals import talker_of


@dataclass(frozen=True)
class RunLine:
    """One invocation as the page shows it."""

    folder: str  # the folder it ran into
    started: str  # when it started (UTC)
    shard: str  # --shard i/N, or "-"
    done: int  # rows written ok
    failed: int  # rows written failed
    skipped: int  # rows already done
    rows_per_s: float  # rows written per wall second
    audio_s_per_s: float  # audio seconds per wall second
    device: str  # the device and dtype, with the GPUs' or processor's name
    talker: str  # the talker file (llm.pt, llm.rl.pt; a run recorded before --llm read llm.pt)
    peak_memory: str  # host and GPU peaks
    bound_by: str  # the stage that bounded the run, where recorded
    stopped_by: str  # the signal that stopped it, or "-"


def _gb(n: object) -> str | None:
    return f"{n / 1e9:.2f} GB" if isinstance(n, int | float) and n > 0 else None


def bounding_stage(run: Mapping[str, Any]) -> str:
    """The stage a run recorded as its bound (``stage_seconds.bound_by``; "-": not recorded)."""
    stages = run.get("stage_seconds")
    value = stages.get("bound_by") if isinstance(stages, Mapping) else None
    return value if isinstance(value, str) and value else "-"


def run_line(folder: str, run: Mapping[str, Any]) -> RunLine:
    """One ``runs.jsonl`` object as a row of the history."""
    started = run.get("started_at")
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)) if isinstance(started, int | float) else "-"
    devices = run.get("devices")
    named = ", ".join(str(d) for d in devices) if isinstance(devices, list) else ""
    device = " ".join(str(x) for x in (run.get("device"), run.get("dtype")) if x) or "-"
    found = run.get("peak_memory")
    peak: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    peaks = [
        f"{label} {v}"
        for label, key in (("host", "host_rss_bytes"), ("GPU", "gpu_allocated_bytes"))
        if (v := _gb(peak.get(key))) is not None
    ]
    return RunLine(
        folder=folder,
        started=when,
        shard=str(run.get("shard") or "-"),
        done=int(run.get("done") or 0),
        failed=int(run.get("failed") or 0),
        skipped=int(run.get("skipped") or 0),
        rows_per_s=float(run.get("rows_per_s") or 0.0),
        audio_s_per_s=float(run.get("throughput_audio_s_per_s") or 0.0),
        device=f"{device} ({named})" if named else device,
        talker=talker_of(run),
        peak_memory=", ".join(peaks) or "-",
        bound_by=bounding_stage(run),
        stopped_by=str(run.get("stopped_by") or "-"),
    )


def read_history(folders: Sequence[Path]) -> list[RunLine]:
    """Every folder's runs, oldest first."""
    found: list[tuple[float, RunLine]] = []
    for folder in folders:
        for run in iter_jsonl(Path(folder) / RUNS_NAME):
            started = run.get("started_at")
            found.append(
                (float(started) if isinstance(started, int | float) else 0.0, run_line(str(folder), run))
            )
    found.sort(key=lambda pair: pair[0])
    return [line for _, line in found]
