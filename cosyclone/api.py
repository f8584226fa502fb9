"""The Python API: load the model once, then synthesize one text, many rows, or a run folder.

    from cosyclone import CosyClone tts = CosyClone("/models/Fun-CosyVoice3-0.5B") r = tts.synthesize("Hello
    there.", prompt_audio="me.wav", prompt_text="What I say in me.wav.") print(r.ok, r.tokens,
    r.sampler[0].nan_steps)  # r.audio: float32 samples at r.sample_rate (24 kHz) results =
    tts.synthesize_rows([{"id": "a", "prompt_audio": "me.wav", "text": "Hi.", "mode": "cross_lingual"}])

A thin facade over the one engine (:class:`cosyclone.engine.Engine`), which ``cosyclone synth``,
``cosyclone say`` and every Ray actor also run: rows are validated by the manifest module (the
same messages, item k reported as "line k + 1"), options are :mod:`cosyclone.options` fields
checked and resolved in the same place, and :meth:`CosyClone.synth_folder` runs a manifest into an
output folder through the same :class:`~cosyclone.run.job.SynthJob` as ``cosyclone synth`` (resume,
lock, totals: the same folder bytes). The same row (same seed, options) gives the same samples
here and under ``synth``.

Signals: while a call works (on the main thread), SIGINT and SIGTERM are caught so that the work
ends cleanly: :meth:`~CosyClone.synth_folder` stops as ``synth`` does (rows in flight get the
``grace`` option's seconds, the accounts are written, the lock released), ``synthesize*`` drop the
rows at once. Then the process's own handlers are back and the signal is handed on to them
(:func:`cosyclone.base.stop.propagate`): Ctrl-C raises KeyboardInterrupt after the cleanup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from cosyclone.base.stop import StopRequest, catch_signals, propagate
from cosyclone.engine import Engine, RowResult, model_config
from cosyclone.errors import CosycloneError
from cosyclone.manifest import ManifestRow, rows_from_dicts
from cosyclone.options import MODEL_FIELDS, Mode, RunOptions, TextFrontendName, build

__all__ = ["CosyClone", "Result", "model_config", "utterance", "validate_rows"]


#: One row's result: its audio (None when the row failed) and what happened on the way (the engine's
#: :class:`~cosyclone.engine.RowResult`, the same object a run folder records).
Result = RowResult


def utterance(
    text: str,
    prompt_audio: str | Path,
    prompt_text: str | None = None,
    *,
    mode: Mode = "zero_shot",
    instruct: str | None = None,
    seed: int | None = None,
    speed: float = 1.0,
    id: str = "utt",
) -> dict[str, Any]:
    """The manifest row (a dict) that :meth:`CosyClone.synthesize` makes of its arguments."""
    row: dict[str, Any] = {"id": id, "prompt_audio": str(prompt_audio), "text": text, "mode": mode,
                           "speed": speed}
    for name, value in (("prompt_text", prompt_text), ("instruct", instruct), ("seed", seed)):
        if value is not None:
            row[name] = value
    return row


def validate_rows(rows: Iterable[Mapping[str, Any] | ManifestRow], *, base: str | Path = ".",
                  text_frontend: TextFrontendName = "wetext") -> list[ManifestRow]:
    """The rows as validated :class:`ManifestRow` s, by the manifest's own checks (duplicate ids
    included; no model needed); raises :class:`CosycloneError` naming every invalid row."""
    items = list(rows)
    given = [r for r in items if isinstance(r, ManifestRow)]
    if len(given) == len(items):
        from cosyclone.manifest import id_key

        if len({id_key(r.id) for r in given}) != len(given):
            raise CosycloneError("duplicate row ids (equal after NFKC normalization and case folding)")
        return given
    if given:
        raise CosycloneError("give rows either all as dicts or all as ManifestRow, not mixed")
    m = rows_from_dicts([dict(r) for r in items if not isinstance(r, ManifestRow)], base=base,
                        text_frontend=text_frontend)
    if m.errors:
        if len(m.errors) == 1:
            raise m.errors[0]
        raise CosycloneError(f"{len(m.errors)} invalid rows: " + "; ".join(str(e) for e in m.errors))
    return m.rows


class CosyClone:
    """A loaded model: build it once (seconds to minutes), then call :meth:`synthesize` freely.

    ``options`` are :mod:`cosyclone.options` fields (``seed``, ``top_k``, ``top_p``, ``win_size``,
    ``tau_r``, ``min_len_ratio``, ``max_len_ratio``, ``max_tokens``, ``n_timesteps``,
    ``batch_size``, ``cuda_graphs``, ...), checked and resolved exactly as ``synth`` resolves them
    (``auto``: bf16 on GPUs with bf16, else fp32; CUDA graphs where the device allows). ``threads``
    sets torch's and ONNX's intra-op threads.
    """

    def __init__(self, model_dir: str | Path | None = None, **options: Any) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.engine = Engine.load(self.model_dir, build(RunOptions, options))

    @property
    def cfg(self) -> Any:
        return self.engine.cfg

    @property
    def policy(self) -> Any:
        return self.engine.policy

    @property
    def stages(self) -> Any:
        return self.engine.stages

    @property
    def options(self) -> RunOptions:
        """The resolved options this model runs under (what a run records)."""
        return self.engine.opts

    @property
    def text_frontend(self) -> TextFrontendName:
        return self.engine.opts.text_frontend

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a run in this precision should say (fp16); the API prints nothing itself."""
        return cast("tuple[str, ...]", self.policy.warnings)

    def synthesize(self, text: str, prompt_audio: str | Path, prompt_text: str | None = None, *,
                   mode: Mode = "zero_shot", instruct: str | None = None, seed: int | None = None,
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
        No stage-0 checkpoint is kept: a call has no folder, and a loaded model serves many calls.
        """
        valid = self.validate(rows, base=base)
        stop = StopRequest(grace=0.0)  # nothing is kept of a call cut short: drop its rows at once
        with catch_signals(stop):
            results = {res.id: res for res in self.engine.run(valid, stop=stop)}
        propagate(stop)  # the engine's session is closed: the interrupt goes on
        return [results[r.id] for r in valid]

    def validate(self, rows: Iterable[Mapping[str, Any] | ManifestRow], *,
                 base: str | Path = ".") -> list[ManifestRow]:
        """:func:`validate_rows` with this object's text frontend."""
        return validate_rows(rows, base=base, text_frontend=self.text_frontend)

    def folder_job(self, manifest: str | Path, out: str | Path, *, log: Callable[[str], None] | None = None,
                   plan_only: bool = False, **options: Any) -> Any:
        """The :class:`~cosyclone.run.job.SynthJob` of ``manifest`` into ``out`` on this loaded model.

        ``options``: :mod:`cosyclone.options` fields that leave the model as loaded (``shard``,
        ``overwrite``, ``float_wav``, ``engine``, ``seed``, ``batch_size``, ``top_k``, ...); unset
        ones are this object's. Call ``.plan()`` on it for what ``synth --dry-run`` prints, ``.run()``
        to synthesize. ``plan_only=True`` opens it as ``--dry-run`` does, for ``.plan()`` alone: texts
        are not normalized ahead where validation does not need them (seconds for 200k rows).
        """
        from cosyclone.run.job import SynthJob

        fixed = sorted(set(options) & set(MODEL_FIELDS))
        if fixed:
            raise CosycloneError(
                f"{', '.join(fixed)} belong to the loaded model: give them to CosyClone(...)"
            )
        own = {
            f: getattr(self.options, f) for f in self.options.__dataclass_fields__ if f not in MODEL_FIELDS
        }
        return SynthJob.open(manifest, out, model_dir=self.model_dir, log=log, loaded=self.engine,
                             plan_only=plan_only, **{**own, **options})

    def synth_folder(self, manifest: str | Path, out: str | Path, *, progress: Any = None,
                     log: Callable[[str], None] | None = None, **options: Any) -> Any:
        """Synthesize ``manifest`` into the run folder ``out`` exactly as ``cosyclone synth`` does
        (resume by fingerprint, the folder lock, ``summary.json``, ``runs.jsonl``); returns the
        :class:`~cosyclone.run.job.JobSummary`. ``options`` as :meth:`folder_job`; ``progress``
        as :meth:`SynthJob.run <cosyclone.run.job.SynthJob.run>`. A signal stops it as it stops
        ``synth`` (``grace`` option), then goes on to the process's handlers (KeyboardInterrupt)."""
        job = self.folder_job(manifest, out, log=log, **options)
        job.stop = StopRequest(grace=job.planned.folder.grace)
        with catch_signals(job.stop):
            summary = job.run(progress=progress)
        propagate(job.stop)  # the folder's accounts are written and its lock released
        return summary
