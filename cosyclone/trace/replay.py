"""One row through the stages, eagerly, with the probes attached: what :func:`replay_row` returns.

The same calls as a run (:func:`~cosyclone.engine.stages.prepare_batch`, the talker's
:func:`~cosyclone.talker.decode.generate` with its in-step sampler, then
:func:`~cosyclone.engine.stages.finish_batch` for flow, speed and HiFT), with three choices that
change no token (each is pinned by the engine's equivalence tests) and make the hooks readable:
each text segment decodes alone in a one-slot session (a row's tokens do not depend on its batch),
its prompt is prefilled in a pass of its own (not riding in a decode step), and no CUDA graph
replays (a graph's kernels bypass the hooks).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace

from torch import Tensor

from cosyclone.engine import stages as stage_calls
from cosyclone.engine.outcome import RowResult
from cosyclone.engine.runner import Engine
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions
from cosyclone.talker.decode import generate
from cosyclone.talker.request import StepMechanics, prompt_length
from cosyclone.talker.results import TalkerResult
from cosyclone.trace.probes import (
    LayerFacts,
    LayerProbe,
    StepFacts,
    StepProbe,
    flow_modules,
    hift_modules,
    talker_modules,
)


@dataclass(frozen=True)
class SegmentTrace:
    """One text segment's decode as the probes saw it."""

    segment: int  # the segment's index within the row
    text: str  # the normalized text the LLM read
    layout: tuple[tuple[str, int], ...]  # the prompt's parts in order and their positions: sos, prompt text,
    # text, task, prompt speech
    steps: tuple[StepFacts, ...]  # every draw
    layers: tuple[LayerFacts, ...]  # --layers: each Qwen2 layer's output per call (call k: draw k's logits)
    tokens: tuple[int, ...]  # the tokens code2wav got (after the silent filter)
    stop_reason: str  # eos | max_len | no_finite_logits | error
    logits: tuple[Tensor, ...] = ()  # each draw's raw logits (V,) fp32 (kept for comparing; not written)


@dataclass(frozen=True)
class Replay:
    """A whole row replayed: its segments, code2wav's layers and the engine's result."""

    opts: RunOptions  # the resolved options the replay ran under
    stage_dtypes: dict[str, str]  # each stage's compute dtype
    segments: tuple[SegmentTrace, ...]
    code2wav_layers: tuple[LayerFacts, ...]  # with --layers: DiT blocks per evaluation, HiFT stages
    result: RowResult  # what a run would have recorded (audio included)


def load_engine(model_dir: str | None, opts: RunOptions) -> Engine:
    """The engine a replay runs on: the row's options, eager (no CUDA graphs)."""
    return Engine.load(model_dir, replace(opts, cuda_graphs="off", batch_size=1, talker_slots=1))


def replay_row(engine: Engine, row: ManifestRow, *, layers: bool, top: int = 5) -> Replay:
    """Replay ``row`` on ``engine`` (its options) with the step probe (``layers``: the layer probes too)."""
    stages, opts = engine.stages, engine.opts
    prepared = stage_calls.prepare_batch(stages, [row], opts)
    dec = replace(stage_calls.decode_options(stages.cfg, opts, stages.sizing), slots=1, cuda_graphs="off",
                  mechanics=StepMechanics(fused_admission=False, sync_every=1, lagged_reads=False))
    speech_size = stages.cfg.talker.speech_token_size
    segments: list[SegmentTrace] = []
    results: dict[int, TalkerResult] = {}
    for i, (_, req) in enumerate(prepared.segments):
        treq = stage_calls.to_talker_request(req)
        steps = StepProbe(speech_token_size=speech_size, top=top)
        probe = LayerProbe("talker", talker_modules(stages.talker.backbone) if layers else ())
        with steps.attached(), probe.attached():
            res = generate(stages.talker, [treq], dec)[0]
        results[i] = res
        texts = prepared.outcomes[row.id].row.segments
        record = texts[i] if i < len(texts) else None
        segments.append(SegmentTrace(
            segment=treq.segment, text=record.text if record is not None else "",
            layout=_layout(int(record.prompt_ids) if record else 0, int(treq.target_len),
                           prompt_length(treq)),
            steps=tuple(steps.steps), layers=tuple(probe.calls), tokens=tuple(res.tokens),
            stop_reason=res.stop_reason, logits=tuple(steps.logits)))
    c2w: list[LayerFacts] = []
    with ExitStack() as stack:
        if layers:
            flow = stack.enter_context(LayerProbe("flow", flow_modules(stages.flow)).attached())
            hift = stack.enter_context(LayerProbe("hift", hift_modules(stages.hift)).attached())
        result = stage_calls.finish_batch(stages, prepared, results, opts)[0]
    if layers:
        c2w = [*flow.calls, *hift.calls]
    return Replay(opts=opts, stage_dtypes=dict(stages.policy.stage_dtypes), segments=tuple(segments),
                  code2wav_layers=tuple(c2w), result=result)


def _layout(prompt_ids: int, target: int, total: int) -> tuple[tuple[str, int], ...]:
    """The parts of an assembled prompt and their lengths: sos, the prompt's text, the text, task id,
    the prompt's speech tokens (what :meth:`CosyVoice3LM.assemble` concatenates)."""
    speech = max(0, total - 2 - prompt_ids - target)
    return (("sos", 1), ("prompt text", prompt_ids), ("text", target), ("task", 1), ("prompt speech", speech))


def part_at(layout: tuple[tuple[str, int], ...], position: int) -> str:
    """Which part of the prompt ``position`` falls in (past the prompt: the generated tokens)."""
    start = 0
    for name, n in layout:
        if position < start + n:
            return name
        start += n
    return "generated"
