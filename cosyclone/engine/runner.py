"""The engine: a loaded model and the options it runs under; rows in, row records out.

Every door runs this one object: ``cosyclone synth`` (through the run folder's job), each Ray
actor, ``cosyclone say`` and the Python API. It owns the pipeline (:mod:`.schedule`), row
isolation (:mod:`.isolation`) and the hand-off to code2wav (:mod:`.stages`); it knows nothing of
output folders: the stage-0 token checkpoint, when a run keeps one, is handed to :meth:`Engine.run`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from cosyclone.base.device import DevicePolicy
from cosyclone.base.memory import read_peaks, reset_peaks
from cosyclone.base.stop import StopRequest
from cosyclone.engine import stages as stage_calls
from cosyclone.engine.batches import plan_batches
from cosyclone.engine.clock import StageClock
from cosyclone.engine.facts import EngineFacts, GraphFacts, StageSeconds
from cosyclone.engine.isolation import TokenCheckpoint
from cosyclone.engine.outcome import RowResult
from cosyclone.engine.schedule import StageSchedule
from cosyclone.engine.setup import model_config, resolve_options
from cosyclone.engine.sizing import Sizing, free_device_bytes, plan_sizing
from cosyclone.engine.stage_ops import StageOps
from cosyclone.engine.stages import Stages
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import MODEL_FIELDS, CudaGraphs, RunOptions
from cosyclone.talker.graph_pool import PROCESS
from cosyclone.talker.occupancy import PROCESS_OCCUPANCY


class Engine:
    """Stages loaded once, under resolved :class:`~cosyclone.options.RunOptions`."""

    def __init__(self, stages: Stages, opts: RunOptions, *, free_bytes: int | None = None) -> None:
        """``free_bytes``: the device memory free after load (default: read now, on an accelerator;
        tests give a made-up figure)."""
        self.stages = stages
        self.opts = opts  # resolved: device, dtype, cpu_gemm and cuda_graphs are never "auto"
        # why CUDA graph captures failed in this engine's runs (none: none did)
        self.graph_errors: list[str] = []
        if free_bytes is None:
            free_bytes = free_device_bytes(stages.policy.device)
        self.free_bytes = free_bytes  # what sizing planned from (None on CPU)
        self.sizing: Sizing = plan_sizing(stages.cfg, stages.policy, opts, free_bytes=free_bytes)
        stages.sizing = self.sizing  # code2wav's budgets (the stages read it per call)
        # the last run's pipeline (its talker slots, its stage seconds)
        self._last: StageSchedule | None = None
        self._occupancy0 = PROCESS_OCCUPANCY.figures()  # the tally when the last pipeline started

    @classmethod
    def load(
        cls, model_dir: str | Path | None, opts: RunOptions, *, cfg: ModelConfig | None = None
    ) -> Engine:
        """Resolve ``opts`` and build the frontend and the three models (dummy weights read no file);
        on an accelerator the sizes come from the memory free once they are loaded."""
        opts, policy = resolve_options(opts, cfg=cfg)
        cfg = cfg if cfg is not None else model_config(model_dir, opts.load_format)
        loaded = stage_calls.load_stages(cfg, policy, opts.load_format, text_frontend=opts.text_frontend,
                                         llm=opts.llm)
        return cls(loaded, opts)

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
            prefetch: bool = True, stop: StopRequest | None = None, ops: StageOps | None = None,
            ) -> Iterator[RowResult]:
        """Synthesize ``rows`` (planned into batches here) or the given planned ``batches``; yields each
        row's result (audio included) in batch order, as soon as its batch is done.

        ``opts``: this run's options (default: the engine's; model fields must match the loaded
        model). ``tokens``: the run's stage-0 checkpoint (talker results reused and kept by segment).
        ``stop``: once requested no further batch starts (the rows in flight finish); once
        immediate, the rows still in flight are dropped. ``ops``: the stage calls (default: the loaded
        stages'; :meth:`pipeline`).
        """
        pipeline = self.pipeline(opts=opts, tokens=tokens, prefetch=prefetch, stop=stop, ops=ops)
        if batches is None:
            batches = plan_batches(rows, pipeline.opts.batch_size or self.sizing.batch_size,
                                   pipeline.opts.token_budget)
        return pipeline.run(batches)

    def pipeline(self, *, opts: RunOptions | None = None, tokens: TokenCheckpoint | None = None,
                 prefetch: bool = True, stop: StopRequest | None = None, ops: StageOps | None = None,
                 clock: StageClock | None = None, ordered: bool = True) -> StageSchedule:
        """One run's pipeline, to be fed part by part (:meth:`StageSchedule.feed`, then
        :meth:`StageSchedule.drain` and :meth:`StageSchedule.close`): its prompt workers and talker
        session live across the parts. Arguments as :meth:`run`; ``ops``/``clock``: stand-in stage
        calls and clock (stand-in stages); ``ordered``: records in batch order (a run folder, which
        takes them in any order, lets a batch with a long row hold only itself)."""
        run_opts = (
            self.opts
            if opts is None
            else replace(
                opts, **{k: getattr(self.opts, k) for k in MODEL_FIELDS}, cuda_graphs=self._graphs(opts)
            )
        )
        sizing = self.sizing if run_opts == self.opts else plan_sizing(self.cfg, self.policy, run_opts,
                                                                        free_bytes=self.free_bytes)
        self.stages.sizing = sizing
        run_opts = (
            replace(run_opts, batch_size=sizing.batch_size) if run_opts.batch_size is None else run_opts
        )
        self._occupancy0 = PROCESS_OCCUPANCY.figures()  # this run's decode steps are what comes after
        self._last = StageSchedule(self.stages, run_opts, tokens=tokens, prefetch=prefetch,
                                   graph_errors=self.graph_errors, stop=stop, ops=ops, clock=clock,
                                   ordered=ordered)
        return self._last

    def _graphs(self, opts: RunOptions) -> CudaGraphs:
        """The run's CUDA graphs choice, resolved against the loaded device (``off`` stays off)."""
        return "off" if opts.cuda_graphs == "off" else self.opts.cuda_graphs

    def facts(self) -> EngineFacts:
        """What this engine chose and measured so far (see :class:`~cosyclone.engine.facts.EngineFacts`):
        device, stage dtypes, sizes, CUDA graphs (process-wide counts), peak memory."""
        policy = self.policy
        g = PROCESS.counts
        graphs = GraphFacts(resolved=self.opts.cuda_graphs, captures=g.captures, replays=g.replays,
                            sessions=g.sessions, reused=g.reused, disabled=PROCESS.disabled)
        last = self._last
        continuous = last is not None and last.opts.schedule == "continuous"
        slots = (last.talker.slots or None) if last is not None and continuous else None
        stages = self._last.clock.seconds() if self._last is not None else StageSeconds.empty()
        return EngineFacts(
            device=str(policy.device),
            backend=policy.backend,
            dtype=policy.dtype_name,
            stage_dtypes=policy.stage_dtypes,
            sizing=self.stages.sizing or self.sizing,
            talker_slots_used=slots,
            graphs=graphs,
            peak=read_peaks(policy.device),
            stages=stages,
            occupancy=PROCESS_OCCUPANCY.figures().since(self._occupancy0),
        )

    def reset_peaks(self) -> None:
        """Start the peak-memory figures afresh (a run that wants its own peaks, not the load's)."""
        reset_peaks(self.policy.device)
