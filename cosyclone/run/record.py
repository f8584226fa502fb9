"""What a run records beside the audio: each row's stamp, the run's devices and versions, what the
CUDA graphs really did. One place, so every engine's records carry the same fields."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..engine import RowRecord
from ..manifest import ManifestRow


class Stamper:
    """Stamps a record with what made it (fingerprint, the row's fields, the run) and hands it to the writer."""

    def __init__(self, rows: Sequence[ManifestRow], fps: Mapping[str, tuple[str, dict[str, str]]], run_id: str,
                 submit: Callable[[RowRecord], None], *, manifest: str, shard: str | None) -> None:
        self.by_id = {r.id: r for r in rows}
        self.fps, self.run_id, self.submit = fps, run_id, submit
        self.manifest, self.shard = manifest, shard

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

    from .. import __version__
    from ..frontend.normalize import get_normalizer

    normalizer = {k: v for k, v in get_normalizer(text_frontend).version().items() if k != "text_frontend"}
    return {"cosyclone": __version__, "torch": torch.__version__, "python": platform.python_version(), **normalizer}
