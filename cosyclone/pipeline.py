"""Scheduling of a synthesis run: manifest rows -> frontend -> talker -> flow -> HiFT -> writer.

This module only wires the stages together (it re-implements none of them). Rows are sorted by
text length and cut into batches so that padding stays small in both stages; every segment of a
row goes through the same batch, and the row's audio is the in-order concatenation of its
segments. A row that fails in the frontend or the talker (e.g. ``no_finite_logits``) is written as
a diagnostics line with its error, and the rest of the batch continues. File writing happens on
the :class:`~cosyclone.writer.BackgroundWriter` thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig
from .device import DevicePolicy
from .manifest import ManifestRow
from .writer import RowRecord

_ABORTS = ("no_finite_logits", "error")


@dataclass(frozen=True)
class RunOptions:
    """Options of one synthesis run (everything that changes the audio is recorded in summary.json)."""

    seed: int = 0  # run seed; a row's seed is row_seed(seed, id) unless the manifest gives one
    batch_size: int = 8  # max rows per batch (all their segments travel together)
    token_budget: int | None = None  # max padded work per batch: rows x largest row_cost (None = rows only)
    top_p: float | None = None  # sampler nucleus mass (None = model yaml)
    top_k: int | None = None  # sampler top-k (None = model yaml)
    win_size: int | None = None  # RAS window (None = model yaml)
    tau_r: float | None = None  # RAS threshold ratio (None = model yaml)
    nonfinite_policy: str = "exclude"  # exclude | error | legacy-zero (LEGACY)
    draw: str = "race"  # race | legacy-multinomial (LEGACY)
    max_tokens: int | None = None  # cap on speech tokens per segment (tests / bench)
    min_tokens: int | None = None  # stop ids blocked below this many tokens per segment (bench: min = max)
    n_timesteps: int | None = None  # flow Euler steps (None = model yaml, 10)
    load_format: str = "auto"  # auto (read the .pt files) | dummy (random weights)
    text_frontend: str = "wetext"  # wetext (official normalizer) | none (official code without one)


@dataclass
class RowOutcome:
    """What happened to one row (also the diagnostics.jsonl line, via :meth:`to_dict`)."""

    row_id: str
    line: int
    seed: int
    status: str = "ok"  # ok | failed
    error: str | None = None
    stop_reasons: list[str] = field(default_factory=list)  # one per segment
    tokens: list[int] = field(default_factory=list)  # speech tokens per segment (after silent filter)
    audio_seconds: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)  # frontend / talker / flow / hift shares
    sampler: list[dict[str, Any]] = field(default_factory=list)  # SamplerRowDiagnostics.to_dict per segment

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["id"] = out.pop("row_id")
        return out


@dataclass
class Stages:
    """The loaded stage objects (built once per run)."""

    cfg: ModelConfig
    policy: DevicePolicy
    frontend: Any
    talker: Any
    flow: Any
    hift: Any


def load_stages(cfg: ModelConfig, policy: DevicePolicy, load_format: str, *,
                text_frontend: str = "wetext") -> Stages:
    """Build frontend and the three models (``load_format`` dummy reads no weight file)."""
    from dataclasses import replace

    from .code2wav.flow import build_flow
    from .code2wav.hift import build_hift
    from .frontend import Frontend
    from .talker.model import build_talker

    talker = build_talker(cfg, policy, load_format=load_format)
    flow = build_flow(cfg, policy, load_format=load_format)
    hift = build_hift(cfg, policy, load_format=load_format)
    for m in (talker, flow, hift):
        m.eval()
    frontend_cfg = cfg
    if cfg.model_dir is None:  # dummy weights without a model directory: built-in frontend assets
        from .tiny import builtin_frontend_dir

        frontend_cfg = replace(cfg, model_dir=builtin_frontend_dir())
    return Stages(cfg=cfg, policy=policy, frontend=Frontend(frontend_cfg, text_frontend=text_frontend),
                  talker=talker, flow=flow, hift=hift)


def _sampler_options(cfg: ModelConfig, opts: RunOptions) -> Any:
    from .talker.sampler import SamplerOptions

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


def _embed(req: Any, key: str) -> torch.Tensor:
    embed = req.embed
    return embed[key] if isinstance(embed, dict) else getattr(embed, key)


def _row_seed(run_seed: int, row: ManifestRow) -> int:
    from .talker.sampler import row_seed

    return int(row.seed) if row.seed is not None else row_seed(run_seed, row.id)


@torch.inference_mode()
def synthesize_batch(stages: Stages, rows: Sequence[ManifestRow], opts: RunOptions) -> list[RowRecord]:
    """Run one batch of rows through every stage; failures stay confined to their row."""
    from .conditioning import to_talker_request
    from .talker.decode import DecodeOptions, generate

    outcomes = {r.id: RowOutcome(row_id=r.id, line=r.line, seed=_row_seed(opts.seed, r)) for r in rows}
    segments: list[tuple[str, Any]] = []  # (row id, Request) in row then segment order
    for row in rows:
        oc = outcomes[row.id]
        t0 = time.perf_counter()
        try:
            reqs = stages.frontend.prepare(row.id, row.prompt_audio, row.prompt_text, row.text, row.mode,
                                           row.instruct, oc.seed, row.speed)
            segments.extend((row.id, r) for r in reqs)
        except Exception as exc:  # a bad prompt or text fails its row only
            oc.status, oc.error = "failed", f"frontend: {type(exc).__name__}: {exc}"
        oc.seconds["frontend"] = time.perf_counter() - t0

    # stage 0: talker, all segments of the batch at once
    dec = DecodeOptions(sampler=_sampler_options(stages.cfg, opts), max_len_override=opts.max_tokens,
                        min_len_override=opts.min_tokens)
    results: dict[int, Any] = {}
    if segments:
        t0 = time.perf_counter()
        try:
            outs = generate(stages.talker, [to_talker_request(r) for _, r in segments], dec)
            results = dict(enumerate(outs))
        except Exception as exc:  # a batch-level failure: retry row by row to isolate it
            for i, (rid, r) in enumerate(segments):
                try:
                    results[i] = generate(stages.talker, [to_talker_request(r)], dec)[0]
                except Exception as exc_row:
                    outcomes[rid].status = "failed"
                    outcomes[rid].error = f"talker: {type(exc_row).__name__}: {exc_row} (batch: {exc})"
        share = (time.perf_counter() - t0) / max(1, len(segments))
        for rid, _ in segments:
            outcomes[rid].seconds["talker"] = outcomes[rid].seconds.get("talker", 0.0) + share
    for i, (rid, _) in enumerate(segments):
        res, oc = results.get(i), outcomes[rid]
        if res is None:
            continue
        oc.stop_reasons.append(res.stop_reason)
        oc.tokens.append(len(res.tokens))
        oc.sampler.append(res.diagnostics.to_dict())
        if res.stop_reason in _ABORTS and oc.status == "ok":
            err = getattr(res.diagnostics, "error", None)
            oc.status, oc.error = "failed", f"talker: {res.stop_reason}" + (f": {err}" if err else "")
        elif not res.tokens and oc.status == "ok":
            oc.status, oc.error = "failed", "talker: no speech tokens generated"

    # stage 1: flow + HiFT for the segments of rows still alive
    live = [(i, rid, r) for i, (rid, r) in enumerate(segments) if outcomes[rid].status == "ok"]
    audio: dict[int, np.ndarray] = {}
    if live:
        try:
            audio = _code2wav(stages, [(r, results[i].tokens) for i, _, r in live], opts, outcomes,
                              [rid for _, rid, _ in live])
            audio = {live[k][0]: a for k, a in audio.items()}
        except Exception as exc:
            for _, rid, _ in live:
                outcomes[rid].status, outcomes[rid].error = "failed", f"code2wav: {type(exc).__name__}: {exc}"

    records = []
    sr = stages.cfg.hift.sampling_rate
    for row in rows:
        oc = outcomes[row.id]
        wav = None
        if oc.status == "ok":
            parts = [audio[i] for i, (rid, _) in enumerate(segments) if rid == row.id]
            wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            oc.audio_seconds = len(wav) / sr
        records.append(RowRecord(row_id=row.id, wav=wav, diagnostics=oc.to_dict()))
    return records


def _code2wav(stages: Stages, items: Sequence[tuple[Any, list[int]]], opts: RunOptions,
              outcomes: dict[str, RowOutcome], rids: Sequence[str]) -> dict[int, np.ndarray]:
    """Batched token2wav over (Request, tokens) items -> float32 waves (each segment at its ``speed``)."""
    from .code2wav.token2wav import token2wav

    dev = stages.policy.device
    tok, tok_len = _pad([torch.as_tensor(t, dtype=torch.long) for _, t in items], dev)
    ptok, ptok_len = _pad([torch.as_tensor(_embed(r, "speech_token"), dtype=torch.long).reshape(-1)
                           for r, _ in items], dev)
    feats = [torch.as_tensor(_embed(r, "speech_feat")).reshape(-1, 80) for r, _ in items]
    pfeat, _ = _pad(feats, dev)
    pfeat = pfeat.to(stages.policy.dtype)
    emb = torch.stack([torch.as_tensor(_embed(r, "embedding")).reshape(-1) for r, _ in items])
    emb = emb.to(dev, dtype=stages.policy.dtype)
    res = token2wav(stages.flow, stages.hift, tok, tok_len, ptok, ptok_len, pfeat, emb,
                    speed=[float(r.speed) for r, _ in items], n_timesteps=opts.n_timesteps)
    for rid in rids:
        outcomes[rid].seconds["flow"] = outcomes[rid].seconds.get("flow", 0.0) + res.flow_seconds / len(items)
        outcomes[rid].seconds["hift"] = outcomes[rid].seconds.get("hift", 0.0) + res.hift_seconds / len(items)
    return {k: w.numpy().astype(np.float32, copy=False) for k, w in enumerate(res.wavs)}


PROMPT_TOKENS_PER_SECOND = 25  # speech tokens per second of prompt audio (token_frame_rate)


def row_cost(row: ManifestRow) -> int:
    """Estimated padded work of one row, in sequence positions (what ``--token-budget`` counts).

    Characters of ``prompt_text + text + instruct`` (a generous stand-in for their text ids, which
    also grows with the speech tokens the row will generate) plus the prompt's speech tokens
    (25 per second of prompt audio, read from its header during validation). The prompt counts
    because it goes through the talker's prefill and through every flow step.
    """
    chars = len(row.prompt_text) + len(row.text) + len(row.instruct)
    return max(1, chars + int(round(PROMPT_TOKENS_PER_SECOND * row.prompt_seconds)))


def plan_batches(rows: Sequence[ManifestRow], batch_size: int,
                 token_budget: int | None = None) -> list[list[ManifestRow]]:
    """Rows sorted by estimated length (stable, so deterministic) and cut into batches of similar length.

    A batch holds at most ``batch_size`` rows and, with ``token_budget``, at most as many rows as
    keep ``len(batch) * max(row_cost)`` (its padded work) within the budget; a single row over the
    budget still gets a batch of its own.
    """
    from .batching import chunks_by_length

    by_line = sorted(rows, key=lambda r: r.line)  # ties in cost break by manifest line
    chunks = chunks_by_length([row_cost(r) for r in by_line], token_budget or 0, max_rows=max(1, batch_size))
    return [[by_line[i] for i in chunk] for chunk in chunks]


def run(stages: Stages, rows: Sequence[ManifestRow], opts: RunOptions,
        submit: Callable[[RowRecord], None], progress: Callable[[int], None] | None = None) -> list[RowRecord]:
    """Synthesize ``rows`` batch by batch, handing each record to ``submit`` (the writer) at once."""
    out: list[RowRecord] = []
    for batch in plan_batches(rows, opts.batch_size, opts.token_budget):
        for rec in synthesize_batch(stages, batch, opts):
            rec.diagnostics["wav"] = f"wavs/{rec.row_id}.wav" if rec.wav is not None else None
            submit(rec)
            out.append(RowRecord(row_id=rec.row_id, wav=None, diagnostics=rec.diagnostics))
        if progress is not None:
            progress(len(batch))
    return out


def model_paths_hint(model_dir: Path | None) -> str:
    return str(model_dir) if model_dir is not None else "<dummy: released geometry>"
