"""Forward hooks that watch a replay: the in-step sampler's draws and each layer's output.

Why hooks: the sampler (:class:`~cosyclone.talker.slot_sampler.SlotSampler`) and the models are
the ones a run uses, called the way a run calls them; a hook sees their inputs and outputs without
a line of trace code in them. Every probe is a context manager: its hooks exist only inside the
``with`` block, so a run never pays for a trace.

The replay decodes one segment in a one-slot session, so slot 0 is the traced row. The sampler's
own counters (``COUNTER_NAMES``) are read before and after each call: their difference names the
events of that draw (RAS fallback, sole restore, min-length suppression) as the sampler itself
counted them, not as a copy of its rules would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
from cosyclone.code2wav.hift import CausalHiFTGenerator
from cosyclone.talker.qwen2 import Qwen2Model
from cosyclone.talker.sampler import COUNTER_NAMES
from cosyclone.talker.slot_sampler import SlotSampler

_COUNTER = {name: k for k, name in enumerate(COUNTER_NAMES)}


@dataclass(frozen=True)
class StepFacts:
    """One draw of the traced row: what the sampler read and what it did."""

    step: int  # the draw's index within the segment (0: the draw from the prompt's logits)
    token: int  # the id drawn (>= speech_token_size: a stop id; after an abort: the stop id returned)
    stop: bool  # the draw ended the segment with a stop id
    aborted: bool  # the sampler aborted the row here (no candidate, or the "error" policy)
    top: tuple[tuple[int, float], ...]  # the likeliest ids and their probabilities (raw logits, NaN left out)
    logit_min: float | None  # the smallest finite logit (None: none finite)
    logit_max: float | None  # the largest finite logit (None: none finite)
    nan: int  # NaN logits
    posinf: int  # +inf logits
    neginf: int  # -inf logits
    ras_fallback: bool  # the repetition check fired and a replacement was drawn
    ras_sole_restore: bool  # the repetition check fired but the repeated id was the only candidate
    min_len_suppressed: bool  # the min-length rule removed a legal stop id

    @property
    def finite(self) -> bool:
        return not (self.nan or self.posinf)


@dataclass
class StepProbe:
    """Records every draw of slot 0 of the :class:`SlotSampler` calls made inside :meth:`attached`."""

    speech_token_size: int  # ids at or above it are stop ids
    top: int = 5  # candidates kept per step
    steps: list[StepFacts] = field(default_factory=list)
    logits: list[Tensor] = field(default_factory=list)  # each draw's raw logits (V,) fp32 on the host
    _before: Tensor | None = None

    @contextmanager
    def attached(self) -> Iterator[StepProbe]:
        """Hooks on every SlotSampler call while the block runs (process-wide, removed on exit)."""
        handles = [nn.modules.module.register_module_forward_pre_hook(self._pre),
                   nn.modules.module.register_module_forward_hook(self._post)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _pre(self, module: nn.Module, args: tuple[object, ...]) -> None:
        if isinstance(module, SlotSampler):
            self._before = module.counters[:, 0].clone()

    def _post(self, module: nn.Module, args: tuple[object, ...], out: object) -> None:
        if not isinstance(module, SlotSampler) or self._before is None:
            return
        logits, live, _step = (a for a in args if isinstance(a, Tensor))
        if not bool(live[0]):
            return
        assert isinstance(out, tuple)
        tokens, aborted = out
        diff = (module.counters[:, 0] - self._before).tolist()
        x = logits[0].detach().float().cpu()
        self.logits.append(x.clone())
        finite = x[torch.isfinite(x)]
        probs = torch.nan_to_num(torch.softmax(torch.nan_to_num(x, nan=float("-inf")), dim=-1), nan=0.0)
        k = min(self.top, int((probs > 0).sum()))  # nothing to show where no logit is a candidate
        top = torch.topk(probs, k)
        token = int(tokens[0])
        self.steps.append(StepFacts(
            step=len(self.steps), token=token, stop=token >= self.speech_token_size and not bool(aborted[0]),
            aborted=bool(aborted[0]),
            top=tuple((int(i), round(float(p), 6)) for p, i in zip(top.values, top.indices, strict=True)),
            logit_min=float(finite.min()) if finite.numel() else None,
            logit_max=float(finite.max()) if finite.numel() else None,
            nan=int(torch.isnan(x).sum()), posinf=int(torch.isposinf(x).sum()),
            neginf=int(torch.isneginf(x).sum()),
            ras_fallback=bool(diff[_COUNTER["ras_fallbacks"]]),
            ras_sole_restore=bool(diff[_COUNTER["ras_sole_restores"]]),
            min_len_suppressed=bool(diff[_COUNTER["min_len_suppressed"]])))


@dataclass(frozen=True)
class LayerFacts:
    """One call of one watched module: its output's size and finiteness."""

    stage: str  # talker | flow | hift
    name: str  # the module, e.g. "layer 3", "block 7", "ups.1"
    call: int  # the module's call index (talker: the step whose logits it made; flow: the DiT evaluation)
    absmax: float | None  # the largest finite |value| (None: nothing finite)
    finite: bool  # every value finite
    nonfinite: int  # NaN and inf values
    first_bad_position: int | None  # the first position (dim 1 of a (B, T, D) output) holding one, if any


@dataclass
class LayerProbe:
    """Forward hooks on ``modules`` ((name, module) pairs of one stage) while :meth:`attached` runs."""

    stage: str
    modules: Sequence[tuple[str, nn.Module]]
    calls: list[LayerFacts] = field(default_factory=list)
    _count: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def attached(self) -> Iterator[LayerProbe]:
        handles: list[RemovableHandle] = [m.register_forward_hook(self._hook(name))
                                          for name, m in self.modules]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _hook(self, name: str) -> Callable[[nn.Module, tuple[object, ...], object], None]:
        def hook(module: nn.Module, args: tuple[object, ...], out: object) -> None:
            t = out if isinstance(out, Tensor) else \
                next((o for o in _flat(out) if isinstance(o, Tensor)), None)
            if t is None:
                return
            call = self._count.get(name, 0)
            self._count[name] = call + 1
            self.calls.append(summarize(self.stage, name, call, t))
        return hook


def _flat(out: object) -> list[object]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def summarize(stage: str, name: str, call: int, t: Tensor) -> LayerFacts:
    """The facts of one output tensor (one host read per call: a trace, not a run)."""
    x = t.detach().float()
    ok = torch.isfinite(x)
    fin = x.abs()[ok]
    bad = int((~ok).sum())
    first = None
    if bad and x.dim() == 3:  # (B, T, D): the first position that holds a non-finite value
        where = (~ok).any(dim=2).any(dim=0).nonzero()
        first = int(where[0, 0]) if where.numel() else None
    return LayerFacts(stage=stage, name=name, call=call, absmax=float(fin.max()) if fin.numel() else None,
                      finite=bad == 0, nonfinite=bad, first_bad_position=first)


def talker_modules(backbone: Qwen2Model) -> list[tuple[str, nn.Module]]:
    """The Qwen2 layers and the final norm, named for the trace."""
    return [*((f"layer {i}", m) for i, m in enumerate(backbone.layers)), ("norm", backbone.norm)]


def flow_modules(flow: CausalMaskedDiffWithDiT) -> list[tuple[str, nn.Module]]:
    """The DiT's transformer blocks and its output projection."""
    dit = flow.decoder.estimator
    return [*((f"block {i}", m) for i, m in enumerate(dit.transformer_blocks)), ("proj_out", dit.proj_out)]


def hift_modules(hift: CausalHiFTGenerator) -> list[tuple[str, nn.Module]]:
    """HiFT's stages in the order they run: F0 predictor, source, conv_pre, each upsampling and its
    resblocks, conv_post (a stage whose prepared kernel bypasses its module records nothing)."""
    names = ["f0_predictor", "m_source", "conv_pre"]
    for i in range(len(hift.ups)):
        names += [f"ups.{i}", f"source_downs.{i}", f"source_resblocks.{i}"]
    names += [f"resblocks.{j}" for j in range(len(hift.resblocks))] + ["conv_post"]
    return [(n, hift.get_submodule(n)) for n in names]
