"""The engine: a loaded model and the options it runs under; rows in, row records out.

Every door runs this one object: ``cosyclone synth`` (through the run folder's job), each Ray
actor, ``cosyclone say`` and the Python API. It owns the schedule (:mod:`.scheduler`), row
isolation (:mod:`.isolation`) and the hand-off to code2wav (:mod:`.stages`); it knows nothing of
output folders: the stage-0 token checkpoint, when a run keeps one, is handed to :meth:`Engine.run`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from cosyclone.base.device import DevicePolicy
from cosyclone.base.stop import StopRequest
from cosyclone.engine import stages as S
from cosyclone.engine.batches import plan_batches
from cosyclone.engine.isolation import TokenCheckpoint
from cosyclone.engine.outcome import RowResult
from cosyclone.engine.schedule import StageSchedule
from cosyclone.engine.setup import model_config, resolve_options
from cosyclone.engine.stages import Stages
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import MODEL_FIELDS, RunOptions


class Engine:
    """Stages loaded once, under resolved :class:`~cosyclone.options.RunOptions`."""

    def __init__(self, stages: Stages, opts: RunOptions) -> None:
        self.stages = stages
        self.opts = opts  # resolved: device, dtype, cpu_gemm and cuda_graphs are never "auto"
        self.graph_errors: list[str] = []  # why CUDA graph captures failed in this engine's runs (none: none did)

    @classmethod
    def load(cls, model_dir: str | Path | None, opts: RunOptions, *, cfg: ModelConfig | None = None) -> Engine:
        """Resolve ``opts`` and build the frontend and the three models (dummy weights read no file)."""
        opts, policy = resolve_options(opts)
        cfg = cfg if cfg is not None else model_config(model_dir, opts.load_format)
        return cls(S.load_stages(cfg, policy, opts.load_format, text_frontend=opts.text_frontend), opts)

    @property
    def cfg(self) -> ModelConfig:
        return self.stages.cfg

    @property
    def policy(self) -> DevicePolicy:
        return self.stages.policy

    @property
    def sample_rate(self) -> int:
        return int(self.cfg.hift.sampling_rate)

    def run(self, rows: Sequence[ManifestRow] = (), *, batches: Sequence[Sequence[ManifestRow]] | None = None,
            opts: RunOptions | None = None, tokens: TokenCheckpoint | None = None,
            prefetch: bool = True, stop: StopRequest | None = None) -> Iterator[RowResult]:
        """Synthesize ``rows`` (planned into batches here) or the given planned ``batches``; yields each
        row's result (audio included) in batch order, as soon as its batch is done.

        ``opts``: this run's options (default: the engine's; model fields must match the loaded
        model). ``tokens``: the run's stage-0 checkpoint (talker results reused and kept by segment).
        ``stop``: once requested no further batch starts (the rows in flight finish); once
        immediate, the rows still in flight are dropped.
        """
        run_opts = self.opts if opts is None else replace(opts, **{k: getattr(self.opts, k) for k in MODEL_FIELDS},
                                                          cuda_graphs=self._graphs(opts))
        if batches is None:
            batches = plan_batches(rows, run_opts.batch_size, run_opts.token_budget)
        return StageSchedule(self.stages, batches, run_opts, tokens=tokens, prefetch=prefetch,
                             graph_errors=self.graph_errors, stop=stop).run()

    def _graphs(self, opts: RunOptions) -> str:
        """The run's CUDA graphs choice, resolved against the loaded device (``off`` stays off)."""
        return "off" if opts.cuda_graphs == "off" else self.opts.cuda_graphs
