"""What a run records beside the audio: each row's stamp, the run's devices and versions, what the
CUDA graphs really did. One place, so every engine's records carry the same fields."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cosyclone import options as O
from cosyclone.engine import RowRecord
from cosyclone.manifest import ManifestRow
from cosyclone.run import fingerprint
from cosyclone.run import folder as runfolder
from cosyclone.run.job_types import JobSummary, Prepared


class Stamper:
    """Stamps a record with what made it (fingerprint, the row's fields, the run) and hands it to the writer."""

    def __init__(self, rows: Sequence[ManifestRow], fps: Mapping[str, tuple[str, dict[str, str]]], run_id: str,
                 submit: Callable[[RowRecord], None], *, manifest: str, shard: str | None) -> None:
        self.by_id = {r.id: r for r in rows}
        self.fps, self.run_id, self.submit = fps, run_id, submit
        self.manifest, self.shard = manifest, shard

    def add(self, rows: Sequence[ManifestRow], fps: Mapping[str, tuple[str, dict[str, str]]]) -> None:
        """A part's rows and fingerprints (a streamed run learns its rows part by part)."""
        self.by_id.update((r.id, r) for r in rows)
        self.fps = {**self.fps, **fps}

    def __call__(self, rec: RowRecord) -> None:
        row = self.by_id[rec.row_id]
        fp, parts = self.fps.get(rec.row_id, (None, None))  # None: the row failed before its fingerprint
        rec.diagnostics.update(fingerprint=fp, fingerprint_parts=parts, run_id=self.run_id, text=row.text,
                               prompt_text=row.prompt_text, prompt_audio=str(row.prompt_audio), mode=row.mode,
                               instruct=row.instruct, speed=row.speed, manifest=self.manifest, shard=self.shard)
        self.submit(rec)


def graphs_record(resolved: str, made: Sequence[Mapping[str, Any]], errors: Sequence[str]) -> dict[str, Any]:
    """What the CUDA graphs really did in a run: the resolved choice (``on`` means "capture where it
    can"), the rows whose decode steps really replayed a graph, the replayed steps, and every failed
    capture (the session went on eagerly)."""
    steps = [sum(int(s.get("graph_steps", 0)) for s in d.get("sampler") or []) for d in made]
    return {"resolved": resolved, "used": any(steps), "rows_with_graph_steps": sum(1 for n in steps if n),
            "graph_steps": sum(steps), "capture_errors": list(dict.fromkeys(errors))}


def devices(policy: Any) -> list[str]:
    """The device names a run used: the GPUs torch sees, or this machine's processor."""
    import platform

    import torch

    if policy.device.type == "cuda" and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [platform.processor() or platform.machine()]


def versions(text_frontend: str) -> dict[str, str]:
    """The versions that change what a run produces: cosyclone, torch, Python, the text normalizers."""
    import platform

    import torch

    from cosyclone.base.version import __version__
    from cosyclone.frontend.normalize import get_normalizer

    normalizer = {k: v for k, v in get_normalizer(text_frontend).version().items() if k != "text_frontend"}
    return {"cosyclone": __version__, "torch": torch.__version__, "python": platform.python_version(), **normalizer}


def summarize(job: Any, prep: Prepared, records: Sequence[RowRecord], current: Mapping[str, Mapping[str, Any]],
              *, run_id: str, wall: float, hits: int, write_error: str | None, written: int) -> JobSummary:
    """Totals of the folder and this run's figures, written to summary.json and runs.jsonl."""
    from cosyclone.run import report
    from cosyclone.run.writer import write_summary

    made = [r.diagnostics for r in records]
    last_run = _last_run(job, prep, made, run_id=run_id, wall=wall, hits=hits, write_error=write_error)
    totals = report.folder_totals(current.values())
    try:
        write_summary(job.out, {**totals, "out_dir": str(job.out), "last_run": last_run})
        runfolder.append_jsonl(job.out / runfolder.RUNS_NAME, last_run)
    except runfolder.OutputFolderError as exc:
        write_error = write_error or str(exc)
        last_run["write_error"] = write_error
    failed = [d for d in made if d.get("status") != "ok"]
    return JobSummary(totals=totals, last_run=last_run, failed=failed, write_error=write_error, written=written)

def _last_run(job: Any, prep: Prepared, made: Sequence[Mapping[str, Any]], *, run_id: str, wall: float,
              hits: int, write_error: str | None) -> dict[str, Any]:
    """This invocation's figures (summary.json ``last_run``, a line of runs.jsonl)."""
    resume, opts, policy = prep.resume, job.opts, job.policy
    audio = sum(float(d.get("audio_seconds") or 0.0) for d in made if d.get("status") == "ok")
    n_ok = sum(1 for d in made if d.get("status") == "ok")
    return {
        "run_id": run_id, "started_at": job.started_at, "finished_at": time.time(), "argv": sys.argv,
        "host": socket.gethostname(), "manifest": job.manifest_label, "shard": job.folder.shard,
        "rows_in_manifest": len(job.rows.rows), "invalid": len(job.rows.errors),
        "invalid_rows": [str(e) for e in job.rows.errors],
        "todo": len(resume.todo) + len(prep.failed), "done": n_ok, "failed": len(made) - n_ok,
        "skipped": len(resume.done), "redone": len(resume.redone), "redone_by": resume.redone_counts(),
        "retried": len(resume.retried), "not_written": len(resume.todo) + len(prep.failed) - len(made),
        "failed_rows": {d["id"]: d.get("error") for d in made if d.get("status") != "ok"},
        "rows_not_in_manifest": len(resume.foreign), "write_error": write_error,
        "talker_checkpoint_hits": hits,
        "audio_seconds": audio, "wall_seconds": wall, "total_wall_seconds": time.time() - job.started_at,
        "rows_per_s": len(made) / wall if wall > 0 and made else 0.0,
        "throughput_audio_s_per_s": audio / wall if wall > 0 else 0.0, "rtf": wall / audio if audio > 0 else None,
        "versions": versions(opts.text_frontend), "devices": devices(policy),
        "model_dir": str(job.model_dir) if job.model_dir else None, "model_hash": prep.ctx.model,
        "model_yaml_sha256": job.cfg.yaml_sha256 or None, "load_format": opts.load_format,
        "device": str(policy.device), "dtype": policy.dtype_name, "dtype_requested": policy.requested_dtype,
        "float_wav": job.folder.float_wav, "options": O.as_record(opts), "algorithm": fingerprint.ALGORITHM_VERSION,
        "engine": job.folder.engine, "ray": _ray_record(job),
        "cuda_graphs": graphs_record(opts.cuda_graphs, made, job._graph_errors),
    }

def _ray_record(job: Any) -> dict[str, Any] | None:
    """--ray-actors/--actor-threads as given and the plan the actors ran under (None: local engine)."""
    if job.folder.engine != "ray":
        return None
    return {"ray_actors": job.folder.ray_actors, "actor_threads": job.folder.actor_threads,
            "address": job.folder.ray_address, "plan": job._ray.as_record() if job._ray is not None else None}
