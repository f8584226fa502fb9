"""The stage calls of a batch: frontend -> (talker, elsewhere) -> code2wav, failures per row.

Wires the stages together and re-implements none of them. A batch's frontend output
(:class:`PreparedBatch`) goes to the talker (:mod:`cosyclone.engine.schedule` decides how) and
its results come back to :func:`finish_batch`, which runs flow and HiFT over the rows still alive
and makes their results. A row that fails in any stage is marked in its :class:`RowOutcome`
(``reason`` and ``error``) and the rest of the batch continues. A row's seed is derived here once
(:func:`row_seed_of`) and handed, unchanged, to every stage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cosyclone.base.capture_guard import CAPTURE_GUARD
from cosyclone.base.device import DevicePolicy
from cosyclone.engine.outcome import (
    ABORTS,
    EMPTY_AFTER_SPEED,
    NO_TOKENS,
    NONFINITE_AUDIO,
    Failure,
    RowOutcome,
    RowResult,
    SegmentText,
)
from cosyclone.frontend.conditioning import Request
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import ModelConfig
from cosyclone.options import DEFAULT_LLM, LoadFormat, RunOptions, TextFrontendName
from cosyclone.talker.request import TalkerRequest

if TYPE_CHECKING:  # annotations only (the stage modules load when the engine builds them)
    from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
    from cosyclone.code2wav.hift import CausalHiFTGenerator
    from cosyclone.engine.sizing import Sizing
    from cosyclone.frontend import Frontend
    from cosyclone.talker.model import CosyVoice3LM
    from cosyclone.talker.request import DecodeOptions
    from cosyclone.talker.results import TalkerResult
    from cosyclone.talker.sampler import SamplerOptions


@dataclass
class Stages:
    """The loaded stage objects (built once per run)."""

    cfg: ModelConfig
    policy: DevicePolicy
    frontend: Frontend
    talker: CosyVoice3LM
    flow: CausalMaskedDiffWithDiT
    hift: CausalHiFTGenerator
    sizing: Sizing | None = None  # the run's sizes (code2wav's budgets); None: the device defaults


def load_stages(cfg: ModelConfig, policy: DevicePolicy, load_format: LoadFormat, *,
                text_frontend: TextFrontendName = "wetext", llm: str = DEFAULT_LLM) -> Stages:
    """Build frontend and the three models (``load_format`` dummy reads no weight file; ``llm``: the
    talker file, ``--llm``)."""
    from dataclasses import replace

    from cosyclone.code2wav.flow import build_flow
    from cosyclone.code2wav.hift import build_hift
    from cosyclone.frontend import Frontend
    from cosyclone.frontend.onnx import default_providers
    from cosyclone.talker.model import build_talker

    talker = build_talker(cfg, policy, load_format=load_format, llm=llm)
    flow = build_flow(cfg, policy, load_format=load_format)
    hift = build_hift(cfg, policy, load_format=load_format)
    for m in (talker, flow, hift):
        m.eval()
    frontend_cfg = cfg
    if cfg.model_dir is None:  # dummy weights without a model directory: built-in frontend assets
        from cosyclone.frontend.tiny_assets import builtin_assets_dir

        frontend_cfg = replace(cfg, model_dir=builtin_assets_dir())
    frontend = Frontend(
        frontend_cfg, providers=default_providers(policy.backend), text_frontend=text_frontend
    )
    return Stages(cfg=cfg, policy=policy, frontend=frontend, talker=talker, flow=flow, hift=hift)


def _sampler_options(cfg: ModelConfig, opts: RunOptions) -> SamplerOptions:
    from cosyclone.talker.sampler import SamplerOptions

    overrides: dict[str, Any] = {"nonfinite_policy": opts.nonfinite_policy, "draw": opts.draw}
    for name in ("top_p", "top_k", "win_size", "tau_r"):
        if getattr(opts, name) is not None:
            overrides[name] = getattr(opts, name)
    return SamplerOptions.from_config(cfg.talker.sampling, **overrides)


def _pad(seqs: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D (or (T, D)) tensors into (B, Tmax[, D]) plus lengths (B,)."""
    lens = torch.tensor([int(s.shape[0]) for s in seqs], dtype=torch.long)
    tmax = max(1, int(lens.max()) if len(seqs) else 1)
    first = seqs[0]
    out = torch.zeros((len(seqs), tmax, *first.shape[1:]), dtype=first.dtype)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s.cpu()
    return out.to(device), lens.to(device)


def _embed(req: Request, key: str) -> torch.Tensor:
    embed = req.embed
    return embed[key] if isinstance(embed, dict) else getattr(embed, key)


def to_talker_request(req: Request) -> TalkerRequest:
    """The talker's request for one conditioned segment (the frontend's :class:`Request`)."""
    return TalkerRequest(row_id=req.row_id, text_ids=req.text_ids.to(torch.long), target_len=req.target_len,
                         prompt_speech_tokens=req.llm_prompt_tokens, seed=req.seed, segment=req.segment)


def row_seed_of(run_seed: int, row: ManifestRow) -> int:
    """The row's seed, derived once: the manifest ``seed`` as given, else ``row_seed(--seed, id)``."""
    from cosyclone.talker.sampler import row_seed

    return int(row.seed) if row.seed is not None else row_seed(run_seed, row.id)


@dataclass
class PreparedBatch:
    """A batch after the frontend: its rows' outcomes (frontend failures already marked) and
    segments, (row id, Request) in row then segment order. Used once, by :func:`synthesize_batch`."""

    rows: list[ManifestRow]
    outcomes: dict[str, RowOutcome]
    segments: list[tuple[str, Request]]


# The frontend (tokenizer, ONNX sessions, caches) runs one row at a time, whichever thread asks: the
# prefetch worker may prepare the next batch while a failed batch is retried row by row.
_FRONTEND_LOCK = threading.Lock()



@torch.inference_mode()
def prepare_batch(stages: Stages, rows: Sequence[ManifestRow], opts: RunOptions, *,
                  prompts: Any = None) -> PreparedBatch:
    """The frontend over ``rows``; a bad prompt or text fails its row only (recorded in its outcome).

    ``prompts``: an :class:`~cosyclone.engine.prefetch.PromptAhead` whose workers computed the rows'
    prompt features ahead (the row is charged their seconds); None: computed here."""
    outcomes = {r.id: RowOutcome(r.id, r.line, row_seed_of(opts.seed, r)) for r in rows}
    segments: list[tuple[str, Request]] = []
    # the position check must use the run's max length ratio when it overrides the model's
    fit = {} if opts.max_len_ratio is None else {"max_len_ratio": opts.max_len_ratio}
    for row in rows:
        oc = outcomes[row.id]
        t0 = time.perf_counter()
        ahead, ahead_seconds = prompts.take(row) if prompts is not None else (None, 0.0)
        extra = fit if ahead is None else {**fit, "features": ahead}
        try:
            with _FRONTEND_LOCK:
                reqs = stages.frontend.prepare(row.id, row.prompt_audio, row.prompt_text, row.text, row.mode,
                                               row.instruct, oc.seed, row.speed, **extra)
            segments.extend((row.id, r) for r in reqs)
            oc.read([_segment_record(r) for r in reqs])
        except Exception as exc:  # a bad prompt or text fails its row only
            oc.fail_exc("frontend", exc)
        oc.took("frontend", time.perf_counter() - t0 + ahead_seconds)
    return PreparedBatch(rows=list(rows), outcomes=outcomes, segments=segments)



def decode_options(cfg: ModelConfig, opts: RunOptions, sizing: Sizing | None) -> DecodeOptions:
    """The talker's :class:`~cosyclone.talker.decode.DecodeOptions` for a run, with the sizing rule's
    caps on a GPU (the cache a slot is sized for, allocated up front; the prefill budget). Every path
    builds its options here (the continuous session, static batches, rows alone, isolation retries),
    so none decodes without the caps: a path without the reserve grows the cache mid-run."""
    from cosyclone.talker import DecodeOptions

    sized = sizing is not None and sizing.sized
    return DecodeOptions(sampler=_sampler_options(cfg, opts), max_len_override=opts.max_tokens,
                         min_len_override=opts.min_tokens, min_len_ratio=opts.min_len_ratio,
                         max_len_ratio=opts.max_len_ratio, slots=opts.talker_slots,
                         cuda_graphs=opts.cuda_graphs,  # resolved once per run (engine.setup): on | off
                         reserve_positions=sizing.reserve_positions if sized and sizing else None,
                         prefill_tokens=sizing.prefill_tokens if sized and sizing else None)


@torch.inference_mode()
def finish_batch(stages: Stages, prepared: PreparedBatch, results: dict[int, TalkerResult],
                 opts: RunOptions) -> list[RowResult]:
    """After the talker: stop reasons into the outcomes, code2wav over the rows still alive, records.

    ``results`` maps a segment's index in ``prepared.segments`` to its talker result; a segment
    without one belongs to a row that already failed.
    """
    rows, outcomes, segments = prepared.rows, prepared.outcomes, prepared.segments
    ratio = stages.cfg.flow.token_mel_ratio
    for i, (rid, req) in enumerate(segments):
        res, oc = results.get(i), outcomes[rid]
        if res is None:
            continue
        oc.decoded(res.stop_reason, len(res.tokens), res.diagnostics)  # diagnostics: None from a test's stub
        if res.stop_reason in ABORTS:
            err = res.diagnostics.error if res.diagnostics is not None else None
            oc.fail("talker", res.stop_reason, res.stop_reason + (f": {err}" if err else ""))
        elif not res.tokens:
            oc.fail("talker", NO_TOKENS, "no speech tokens generated")
        elif _frames_after_speed(ratio * len(res.tokens), float(req.speed)) <= 0:
            oc.fail("code2wav", EMPTY_AFTER_SPEED,
                    f"speed {float(req.speed):g} leaves segment {req.segment} with 0 mel frames "
                    f"({len(res.tokens)} tokens = {ratio * len(res.tokens)} frames, "
                    f"int({ratio * len(res.tokens)} / {float(req.speed):g}) = 0)")

    # stage 1: flow + HiFT for the segments of rows still alive
    live = [(i, rid, r) for i, (rid, r) in enumerate(segments) if outcomes[rid].status == "ok"]
    audio: dict[int, np.ndarray] = {}
    if live:
        audio, failure = _code2wav_guarded(stages, live, results, opts, outcomes)
        if failure is not None:  # retry row by row: an exception fails only the rows that raise it alone
            audio = _code2wav_rows(stages, live, results, opts, outcomes, failure)
    for i, rid, _ in live:
        if i in audio:
            audio[i] = _check_audio(outcomes[rid], audio[i], opts.nonfinite_audio)

    records = []
    sr = stages.cfg.hift.sampling_rate
    for row in rows:
        oc = outcomes[row.id]
        wav = None
        if oc.status == "ok":
            parts = [audio[i] for i, (rid, _) in enumerate(segments) if rid == row.id]
            wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        records.append(oc.result(wav, int(sr)))
    return records


def _segment_record(req: Request) -> SegmentText:
    """What the LLM read for one segment, for the row's result (a bad row traces to its text)."""
    ids = getattr(req, "text_ids", None)
    target = int(getattr(req, "target_len", 0) or 0)
    total = int(ids.numel()) if isinstance(ids, torch.Tensor) else target
    return SegmentText(
        text=str(getattr(req, "segment_text", "")), text_ids=target, prompt_ids=max(0, total - target)
    )


def _frames_after_speed(frames: int, speed: float) -> int:
    from cosyclone.code2wav.token2wav import speed_frames

    return speed_frames(frames, speed)


def _check_audio(oc: RowOutcome, wav: np.ndarray, policy: str) -> np.ndarray:
    """Count a segment's NaN/inf samples; fail the row (``fail``) or zero them as LEGACY did (``zero``)."""
    finite = np.isfinite(wav)
    bad = int(wav.size - np.count_nonzero(finite))
    if not bad:
        return wav
    oc.nonfinite(bad)
    if policy == "zero":
        zeroed: np.ndarray = np.nan_to_num(wav, nan=0.0, posinf=1.0, neginf=-1.0)
        return zeroed
    n_nan = int(np.isnan(wav).sum())
    oc.fail("code2wav", NONFINITE_AUDIO, f"nonfinite_audio: {bad} of {wav.size} samples of a segment are not "
                                          f"finite ({n_nan} NaN, {bad - n_nan} inf); --nonfinite-audio zero "
                                          "writes them as 0 / +-1 instead")
    return wav


_Live = Sequence[tuple[int, str, Request]]


def _code2wav_guarded(stages: Stages, live: _Live, results: dict[int, TalkerResult], opts: RunOptions,
                      outcomes: dict[str, RowOutcome]) -> tuple[dict[int, np.ndarray], Failure | None]:
    """:func:`_code2wav`, or what it raised as a :class:`Failure` (no frame, so none of the call's
    tensors, outlives the handler); after an out-of-memory error the device cache is freed."""
    try:
        return _code2wav(stages, live, results, opts, outcomes), None
    except Exception as exc:
        failure = Failure.of(exc)
    if failure.oom:  # the handler has ended: the failed call's activations are free to return
        from cosyclone.talker.graph_pool import free_device_cache

        free_device_cache(stages.policy.device)
    return {}, failure


def _code2wav_rows(stages: Stages, live: _Live, results: dict[int, TalkerResult], opts: RunOptions,
                   outcomes: dict[str, RowOutcome], batch: Failure) -> dict[int, np.ndarray]:
    """code2wav row by row after the whole call raised ``batch``: a row that raises alone fails."""
    audio: dict[int, np.ndarray] = {}
    for rid in dict.fromkeys(rid for _, rid, _ in live):
        mine, failure = _code2wav_guarded(stages, [x for x in live if x[1] == rid], results, opts, outcomes)
        audio.update(mine)
        if failure is not None:
            outcomes[rid].fail_exc("code2wav", failure, note=f" (the batch raised {batch.describe()})")
    return audio


def _code2wav(stages: Stages, live: _Live, results: dict[int, TalkerResult], opts: RunOptions,
              outcomes: dict[str, RowOutcome]) -> dict[int, np.ndarray]:
    """Batched token2wav over ``live`` (segment index, row id, Request) -> {segment index: float32 wave}.

    Each segment is changed to its own ``speed``; flow and HiFT time is shared out per segment.
    """
    from cosyclone.code2wav.token2wav import token2wav

    items = [(r, results[i].tokens) for i, _, r in live]
    dev = stages.policy.device
    tok, tok_len = _pad([torch.as_tensor(t, dtype=torch.long) for _, t in items], dev)
    ptok, ptok_len = _pad([torch.as_tensor(_embed(r, "speech_token"), dtype=torch.long).reshape(-1)
                           for r, _ in items], dev)
    feats = [torch.as_tensor(_embed(r, "speech_feat")).reshape(-1, 80) for r, _ in items]
    pfeat, _ = _pad(feats, dev)
    pfeat = pfeat.to(stages.policy.dit_dtype)
    emb = torch.stack([torch.as_tensor(_embed(r, "embedding")).reshape(-1) for r, _ in items])
    emb = emb.to(dev, dtype=stages.policy.dit_dtype)
    with CAPTURE_GUARD.device_work():  # a decode-step capture waits for this call (module capture_guard)
        res = token2wav(stages.flow, stages.hift, tok, tok_len, ptok, ptok_len, pfeat, emb,
                        speed=[float(r.speed) for r, _ in items], n_timesteps=opts.n_timesteps,
                        **code2wav_budgets(stages.sizing))
    for _, rid, _ in live:
        outcomes[rid].took("flow", res.flow_seconds / len(items))
        outcomes[rid].took("hift", res.hift_seconds / len(items))
    return {i: w.numpy().astype(np.float32, copy=False) for (i, _, _), w in zip(live, res.wavs, strict=True)}


def code2wav_budgets(sizing: Sizing | None) -> dict[str, int]:
    """token2wav's per-call budgets and ROCm buckets from the run's sizing; none on CPU (the
    stages' own CPU defaults run, the same code path as before sizing existed)."""
    if sizing is None or not sizing.sized:
        return {}
    return {"flow_max_tokens": sizing.flow_max_tokens, "hift_max_frames": sizing.hift_max_frames,
            "flow_bucket": sizing.flow_bucket, "hift_bucket": sizing.hift_bucket}
