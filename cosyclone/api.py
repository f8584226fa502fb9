"""The Python API: load the model once, then synthesize one text or many rows.

    from cosyclone import CosyClone
    tts = CosyClone("/models/Fun-CosyVoice3-0.5B")
    r = tts.synthesize("Hello there.", prompt_audio="me.wav", prompt_text="What I say in me.wav.")
    print(r.diagnostics["tokens"], r.sample_rate)  # r.audio: float32 samples at 24 kHz
    results = tts.synthesize_rows([{"id": "a", "prompt_audio": "me.wav", "text": "Hi.", "mode": "cross_lingual"}])

This is the same engine as ``cosyclone synth``, not a second one: rows are validated by the
manifest module (the same messages, item k reported as "line k + 1"), planned by
:func:`cosyclone.pipeline.plan_batches` and run by :func:`cosyclone.pipeline.synthesize_batch` on
stages built once by :func:`cosyclone.pipeline.load_stages`. ``cosyclone say`` is a thin layer
over :meth:`CosyClone.synthesize`; :meth:`CosyClone.run` is :func:`cosyclone.pipeline.run` on the
loaded stages, for callers that bring their own writer; :meth:`CosyClone.synth_folder` runs a
manifest into an output folder through the same :class:`~cosyclone.synth_job.SynthJob` as
``cosyclone synth`` (resume, lock, totals: the same folder bytes). The same row (same seed,
options) gives the same samples here and under ``synth``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CosycloneError
from .manifest import ManifestRow, rows_from_dicts

__all__ = ["CosyClone", "Result", "model_config", "utterance", "validate_rows"]

LOAD_FORMATS = ("auto", "dummy")


@dataclass
class Result:
    """One row's outcome: its audio (None when the row failed) and its diagnostics."""

    id: str  # the row id
    audio: np.ndarray | None  # (N,) float32 mono at ``sample_rate``; None for a failed row
    sample_rate: int  # 24000 for the released model
    diagnostics: dict[str, Any] = field(default_factory=dict)  # what synth writes to diagnostics.jsonl

    @property
    def ok(self) -> bool:
        return self.diagnostics.get("status") == "ok"

    @property
    def error(self) -> str | None:
        """Why the row failed ("<stage>: <what happened>"), None when it did not."""
        return self.diagnostics.get("error")


def model_config(model_dir: str | Path | None, load_format: str = "auto"):
    """The :class:`~cosyclone.config.ModelConfig` to run: a model directory's, or the released
    geometry for ``load_format="dummy"`` without one (random weights, nothing read)."""
    from .config import load_model_config, released_config

    if load_format not in LOAD_FORMATS:
        raise CosycloneError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, not {load_format!r}")
    if model_dir is not None:
        return load_model_config(model_dir)
    if load_format != "dummy":
        raise CosycloneError("give a model directory (--model-dir DIR or COSYCLONE_MODEL_DIR), "
                             "or load_format dummy (--load-format dummy) for random weights at released size")
    return released_config()


def utterance(text: str, prompt_audio: str | Path, prompt_text: str | None = None, *, mode: str = "zero_shot",
              instruct: str | None = None, seed: int | None = None, speed: float = 1.0,
              id: str = "utt") -> dict[str, Any]:
    """The manifest row (a dict) that :meth:`CosyClone.synthesize` makes of its arguments."""
    row: dict[str, Any] = {"id": id, "prompt_audio": str(prompt_audio), "text": text, "mode": mode,
                           "speed": speed}
    for name, value in (("prompt_text", prompt_text), ("instruct", instruct), ("seed", seed)):
        if value is not None:
            row[name] = value
    return row


def validate_rows(rows: Iterable[Mapping[str, Any] | ManifestRow], *, base: str | Path = ".",
                  text_frontend: str = "wetext") -> list[ManifestRow]:
    """The rows as validated :class:`ManifestRow` s, by the manifest's own checks (duplicate ids
    included; no model needed); raises :class:`CosycloneError` naming every invalid row."""
    items = list(rows)
    given = [r for r in items if isinstance(r, ManifestRow)]
    if len(given) == len(items):
        from .manifest import id_key

        if len({id_key(r.id) for r in given}) != len(given):
            raise CosycloneError("duplicate row ids (equal after NFKC normalization and case folding)")
        return given
    if given:
        raise CosycloneError("give rows either all as dicts or all as ManifestRow, not mixed")
    m = rows_from_dicts([dict(r) for r in items], base=base, text_frontend=text_frontend)
    if m.errors:
        if len(m.errors) == 1:
            raise m.errors[0]
        raise CosycloneError(f"{len(m.errors)} invalid rows: " + "; ".join(str(e) for e in m.errors))
    return m.rows


class CosyClone:
    """A loaded model: build it once (seconds to minutes), then call :meth:`synthesize` freely.

    ``options`` are :class:`~cosyclone.pipeline.RunOptions` fields (``seed``, ``top_k``, ``top_p``,
    ``win_size``, ``tau_r``, ``min_len_ratio``, ``max_len_ratio``, ``max_tokens``, ``n_timesteps``,
    ``batch_size``, ...); device and dtype are resolved once, as ``synth`` does (``auto``: bf16 on
    GPUs with bf16, else fp32), and so is ``cpu_gemm`` (:mod:`cosyclone.cpu_gemm`). ``threads`` sets torch's and ONNX's intra-op threads.
    """

    def __init__(self, model_dir: str | Path | None = None, *, load_format: str = "auto", device: str = "auto",
                 dtype: str = "auto", text_frontend: str = "wetext", threads: int | None = None,
                 cpu_gemm: str = "auto", **options: Any) -> None:
        from .device import resolve, set_threads
        from .pipeline import RunOptions, load_stages

        set_threads(threads)
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.cfg = model_config(model_dir, load_format)
        self.policy = resolve(device, dtype, cpu_gemm)
        self.text_frontend = text_frontend
        try:
            base = RunOptions(**options)
        except TypeError as exc:  # an unknown option name
            raise CosycloneError(f"unknown option: {exc}") from exc
        self.options = replace(base, load_format=load_format, text_frontend=text_frontend,
                               device=self.policy.device.type, dtype=self.policy.dtype_name,
                               cpu_gemm=self.policy.cpu_gemm)
        self.stages = load_stages(self.cfg, self.policy, load_format, text_frontend=text_frontend)

    @property
    def sample_rate(self) -> int:
        return int(self.cfg.hift.sampling_rate)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a run in this precision should say (fp16); the API prints nothing itself."""
        return self.policy.warnings

    def synthesize(self, text: str, prompt_audio: str | Path, prompt_text: str | None = None, *,
                   mode: str = "zero_shot", instruct: str | None = None, seed: int | None = None,
                   speed: float = 1.0, id: str = "utt") -> Result:
        """Speak ``text`` in the voice of ``prompt_audio``; one row, validated as a manifest row.

        ``seed`` is the row's seed exactly (a manifest row's ``seed``); None derives it from the
        run seed (option ``seed``, default 0) and ``id``, as ``synth`` does. An invalid row raises
        :class:`~cosyclone.errors.ManifestError`; a row that fails in a stage returns a Result
        whose ``ok`` is False and whose ``error`` says why.
        """
        row = utterance(text, prompt_audio, prompt_text, mode=mode, instruct=instruct, seed=seed, speed=speed,
                        id=id)
        return self.synthesize_rows([row])[0]

    def synthesize_rows(self, rows: Iterable[Mapping[str, Any] | ManifestRow], *,
                        base: str | Path = ".") -> list[Result]:
        """Synthesize manifest-shaped rows (dicts with the manifest's fields, or validated
        :class:`ManifestRow` s), batched as ``synth`` batches them; results in input order.

        Relative ``prompt_audio`` paths are taken from ``base``. Any invalid row raises
        :class:`~cosyclone.errors.CosycloneError` listing every invalid row, before model work.
        """
        from .pipeline import run

        valid = self.validate(rows, base=base)
        records = {}

        def keep(rec: Any) -> None:
            records[rec.row_id] = rec

        run(self.stages, valid, self.options, keep)  # the pipeline synth runs, with no folder to write
        return [Result(id=r.id, audio=records[r.id].wav, sample_rate=self.sample_rate,
                       diagnostics={k: v for k, v in records[r.id].diagnostics.items() if k != "wav"})
                for r in valid]

    def validate(self, rows: Iterable[Mapping[str, Any] | ManifestRow], *,
                 base: str | Path = ".") -> list[ManifestRow]:
        """:func:`validate_rows` with this object's text frontend."""
        return validate_rows(rows, base=base, text_frontend=self.text_frontend)

    def folder_job(self, manifest: str | Path, out: str | Path, *, log: Callable[[str], None] | None = None,
                   **options: Any) -> Any:
        """The :class:`~cosyclone.synth_job.SynthJob` of ``manifest`` into ``out`` on this loaded model.

        ``options``: :class:`~cosyclone.synth_job.FolderOptions` fields (``shard``, ``overwrite``,
        ``float_wav``, ``engine``, ...) and :class:`~cosyclone.pipeline.RunOptions` fields that
        leave the model as loaded (``seed``, ``batch_size``, ``top_k``, ``max_tokens``, ...). Call
        ``.plan()`` on it for what ``synth --dry-run`` prints, ``.run()`` to synthesize.
        """
        from .manifest import read_manifest
        from .synth_job import FolderOptions, SynthJob

        folder_names = {f.name for f in fields(FolderOptions)}
        folder = FolderOptions(**{k: v for k, v in options.items() if k in folder_names})
        run = {k: v for k, v in options.items() if k not in folder_names}
        fixed = sorted(set(run) & {"load_format", "text_frontend", "device", "dtype", "cpu_gemm"})
        if fixed:
            raise CosycloneError(f"{', '.join(fixed)} belong to the loaded model: give them to CosyClone(...)")
        try:
            opts = replace(self.options, **run)
        except TypeError as exc:  # an unknown option name
            raise CosycloneError(f"unknown option: {exc}") from None
        full = read_manifest(manifest, text_frontend=self.text_frontend)
        return SynthJob(full, Path(out), opts, cfg=self.cfg, policy=self.policy, model_dir=self.model_dir,
                        folder=folder, log=log, tts=self, manifest_label=str(manifest))

    def synth_folder(self, manifest: str | Path, out: str | Path, *, progress: Any = None,
                     log: Callable[[str], None] | None = None, **options: Any) -> Any:
        """Synthesize ``manifest`` into the run folder ``out`` exactly as ``cosyclone synth`` does
        (resume by fingerprint, the folder lock, ``summary.json``, ``runs.jsonl``); returns the
        :class:`~cosyclone.synth_job.JobSummary`. ``options`` as :meth:`folder_job`; ``progress``
        as :meth:`SynthJob.run <cosyclone.synth_job.SynthJob.run>`."""
        return self.folder_job(manifest, out, log=log, **options).run(progress=progress)

    def run(self, rows: Sequence[ManifestRow], opts: Any = None, submit: Callable[[Any], None] | None = None,
            progress: Callable[[Any], None] | None = None) -> list[Any]:
        """:func:`cosyclone.pipeline.run` on the loaded stages (``opts`` default: this object's)."""
        from .pipeline import run

        if submit is None:
            raise CosycloneError("run() needs a submit callable (e.g. BackgroundWriter.submit)")
        return run(self.stages, rows, opts if opts is not None else self.options, submit, progress)
