"""Scheduling of a synthesis run: manifest rows -> frontend -> talker -> flow -> HiFT -> writer.

This module only wires the stages together (it re-implements none of them). Rows are sorted by
text length and cut into batches so that padding stays small in both stages; every segment of a
row goes through the same batch, and the row's audio is the in-order concatenation of its
segments. A row that fails in any stage is written as a diagnostics line with its ``reason``
(``no_finite_logits``, ``nonfinite_audio``, ``empty_after_speed``, ``exception``, ...) and error, and
the rest of the batch continues; an exception is recorded with its type, message and traceback.
A row's seed is derived here once (:func:`row_seed_of`) and handed, unchanged, to every stage.
File writing happens on the :class:`~cosyclone.writer.BackgroundWriter` thread; the next batch's
frontend runs on a worker thread while the current batch is in the models (:func:`run`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig
from .device import DevicePolicy
from .errors import CosycloneError
from .manifest import ManifestRow
from .writer import RowRecord

log = logging.getLogger(__name__)

_ABORTS = ("no_finite_logits", "error")

# Why a row failed (``RowOutcome.reason``); sampler aborts use their stop reason
# ("no_finite_logits", "error").
BAD_INPUT = "bad_input"  # a CosycloneError raised in a stage: something the user can fix, named in `error`
EXCEPTION = "exception"  # any other exception in a stage: type, message and traceback are recorded
NO_TOKENS = "no_speech_tokens"  # the talker stopped before emitting a speech token
EMPTY_AFTER_SPEED = "empty_after_speed"  # the row's speed leaves a segment 0 mel frames (int(2n / speed) == 0)
NONFINITE_AUDIO = "nonfinite_audio"  # code2wav produced NaN/inf samples (under --nonfinite-audio fail)

#: ``--nonfinite-audio``: fail (default) fails a row with any NaN/inf sample (NONFINITE_AUDIO); zero
#: (LEGACY) writes NaN as 0 and +-inf as +-1. Both count the samples (``nonfinite_audio_samples``).
NONFINITE_AUDIO_POLICIES = ("fail", "zero")

#: ``--schedule``: how rows reach the talker (RunOptions.schedule).
SCHEDULES = ("continuous", "static")


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
    min_len_ratio: float | None = None  # stop ids blocked below int(ratio x target text ids) tokens (None: 2)
    max_len_ratio: float | None = None  # at most int(ratio x target text ids) tokens per segment (None: 20)
    nonfinite_policy: str = "exclude"  # exclude | error | legacy-zero (LEGACY)
    draw: str = "race"  # race | legacy-multinomial (LEGACY)
    max_tokens: int | None = None  # cap on speech tokens per segment (tests / bench)
    min_tokens: int | None = None  # stop ids blocked below this many tokens per segment (bench: min = max)
    n_timesteps: int | None = None  # flow Euler steps (None = model yaml, 10)
    load_format: str = "auto"  # auto (read the .pt files) | dummy (random weights)
    text_frontend: str = "wetext"  # wetext (official normalizer) | none (official code without one)
    nonfinite_audio: str = "fail"  # fail | zero (LEGACY): what a NaN/inf audio sample does (NONFINITE_AUDIO_POLICIES)
    device: str = "cpu"  # resolved device type the stages run on (recorded; never "auto")
    dtype: str = "fp32"  # resolved run dtype fp32 | bf16 | fp16 (recorded; never "auto"; see device.py)
    cpu_gemm: str = "aten"  # resolved library of the fp32 linear layers on CPU: onednn | aten (recorded;
    # never "auto"; always "aten" off CPU; see cpu_gemm.py). Rounding differs, so it is part of the fingerprint
    talker_slots: int | None = None  # segments the talker decodes at once (None: the whole batch); same output
    cuda_graphs: str = "off"  # on | off as resolved by synth (recorded): the talker step replayed as CUDA graphs
    # where the device allows (any value but "off" lets DecodeOptions resolve "auto")
    schedule: str = "continuous"  # continuous: one talker session for the run, rows take freed slots across
    # batches and each batch goes to code2wav when its last row leaves the talker; static: batch by batch
    # (SCHEDULES). Same tokens and the same code2wav batches, so the same WAV bytes
    code2wav_thread: bool | None = None  # code2wav of a finished batch on a worker thread while the talker
    # goes on (None: on CUDA/ROCm, where it runs on its own stream; off on CPU, where the two interleave)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, not {self.schedule!r}")
        if self.nonfinite_audio not in NONFINITE_AUDIO_POLICIES:
            raise ValueError(f"nonfinite_audio must be one of {NONFINITE_AUDIO_POLICIES}, not {self.nonfinite_audio!r}")


@dataclass
class RowOutcome:
    """What happened to one row (also the diagnostics.jsonl line, via :meth:`to_dict`)."""

    row_id: str
    line: int
    seed: int  # the row's seed, derived once (manifest seed, else row_seed(--seed, id)); the sampler uses it
    status: str = "ok"  # ok | failed
    error: str | None = None  # "<stage>: <what happened>" for a failed row
    reason: str | None = None  # why it failed: BAD_INPUT, EXCEPTION, NO_TOKENS, ... or the sampler's stop reason
    error_type: str | None = None  # exception class name when a stage raised
    traceback: str | None = None  # formatted traceback when a stage raised something other than CosycloneError
    stop_reasons: list[str] = field(default_factory=list)  # one per segment
    tokens: list[int] = field(default_factory=list)  # speech tokens per segment (after silent filter)
    audio_seconds: float = 0.0
    nonfinite_audio_samples: int = 0  # NaN/inf samples in the row's code2wav output (failed or zeroed)
    seconds: dict[str, float] = field(default_factory=dict)  # frontend / talker / flow / hift shares
    sampler: list[dict[str, Any]] = field(default_factory=list)  # SamplerRowDiagnostics.to_dict per segment
    segments: list[dict[str, Any]] = field(default_factory=list)  # what the LLM read, per segment: normalized
    # text, its target ids ("text_ids") and the prompt text ids before it ("prompt_ids"), counts only

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["id"] = out.pop("row_id")
        return out

    def fail(self, stage: str, reason: str, message: str) -> None:
        """Mark the row failed (the first failure wins: later stages do not overwrite it)."""
        if self.status == "ok":
            self.status, self.reason, self.error = "failed", reason, f"{stage}: {message}"

    def fail_exc(self, stage: str, exc: BaseException, *, note: str = "") -> None:
        """Mark the row failed by an exception: type and message always, the traceback unless the
        exception is a :class:`CosycloneError` (a user-fixable error whose message says it all)."""
        if self.status != "ok":
            return
        user = isinstance(exc, CosycloneError)
        self.fail(stage, BAD_INPUT if user else EXCEPTION, f"{type(exc).__name__}: {exc}{note}")
        self.error_type = type(exc).__name__
        if not user:
            self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


@dataclass
class Stages:
    """The loaded stage objects (built once per run)."""

    cfg: ModelConfig
    policy: DevicePolicy
    frontend: Any
    talker: Any
    flow: Any
    hift: Any
    token_store: Any = None  # a TokenStore: talker results reused / kept per segment (the run folder sets it)


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


def row_seed_of(run_seed: int, row: ManifestRow) -> int:
    """The row's seed, derived once: the manifest ``seed`` as given, else ``row_seed(--seed, id)``."""
    from .talker.sampler import row_seed

    return int(row.seed) if row.seed is not None else row_seed(run_seed, row.id)


@dataclass
class PreparedBatch:
    """A batch after the frontend: its rows' outcomes (frontend failures already marked) and
    segments, (row id, Request) in row then segment order. Used once, by :func:`synthesize_batch`."""

    rows: list[ManifestRow]
    outcomes: dict[str, RowOutcome]
    segments: list[tuple[str, Any]]


# The frontend (tokenizer, ONNX sessions, caches) runs one row at a time, whichever thread asks: the
# prefetch worker may prepare the next batch while a failed batch is retried row by row.
_FRONTEND_LOCK = threading.Lock()


@torch.inference_mode()
def prepare_batch(stages: Stages, rows: Sequence[ManifestRow], opts: RunOptions) -> PreparedBatch:
    """The frontend over ``rows``; a bad prompt or text fails its row only (recorded in its outcome)."""
    outcomes = {r.id: RowOutcome(row_id=r.id, line=r.line, seed=row_seed_of(opts.seed, r)) for r in rows}
    segments: list[tuple[str, Any]] = []
    # the position check must use the run's max length ratio when it overrides the model's
    fit = {} if opts.max_len_ratio is None else {"max_len_ratio": opts.max_len_ratio}
    for row in rows:
        oc = outcomes[row.id]
        t0 = time.perf_counter()
        try:
            with _FRONTEND_LOCK:
                reqs = stages.frontend.prepare(row.id, row.prompt_audio, row.prompt_text, row.text, row.mode,
                                               row.instruct, oc.seed, row.speed, **fit)
            segments.extend((row.id, r) for r in reqs)
            oc.segments = [_segment_record(r) for r in reqs]
        except Exception as exc:  # a bad prompt or text fails its row only
            oc.fail_exc("frontend", exc)
        oc.seconds["frontend"] = time.perf_counter() - t0
    return PreparedBatch(rows=list(rows), outcomes=outcomes, segments=segments)


@torch.inference_mode()
def synthesize_batch(stages: Stages, rows: Sequence[ManifestRow], opts: RunOptions,
                     prepared: PreparedBatch | None = None) -> list[RowRecord]:
    """Run one batch of rows through every stage; failures stay confined to their row.

    ``prepared`` is this batch's frontend output when it was computed ahead (:func:`run`'s
    prefetch); without it the frontend runs here. A stage that raises for the whole batch is
    retried row by row (segment by segment in the talker), so an exception fails only the rows
    that raise it alone, with its type, message and traceback recorded (:meth:`RowOutcome.fail_exc`).
    """
    if prepared is None:
        prepared = prepare_batch(stages, rows, opts)
    elif [r.id for r in prepared.rows] != [r.id for r in rows]:
        raise ValueError("prepared batch does not match its rows")
    outcomes, segments = prepared.outcomes, prepared.segments

    # stage 0: talker, all segments of the batch at once
    results: dict[int, Any] = {}
    if segments:
        t0 = time.perf_counter()
        results = talker_with_checkpoint(stages, segments, decode_options(stages.cfg, opts), outcomes)
        share = (time.perf_counter() - t0) / max(1, len(segments))
        for rid, _ in segments:
            outcomes[rid].seconds["talker"] = outcomes[rid].seconds.get("talker", 0.0) + share
    return finish_batch(stages, prepared, results, opts)


def decode_options(cfg: ModelConfig, opts: RunOptions) -> Any:
    """The talker's :class:`~cosyclone.talker.decode.DecodeOptions` for a run."""
    from .talker.decode import DecodeOptions

    return DecodeOptions(sampler=_sampler_options(cfg, opts), max_len_override=opts.max_tokens,
                         min_len_override=opts.min_tokens, min_len_ratio=opts.min_len_ratio,
                         max_len_ratio=opts.max_len_ratio, slots=opts.talker_slots,
                         cuda_graphs="off" if opts.cuda_graphs == "off" else "auto")


@torch.inference_mode()
def finish_batch(stages: Stages, prepared: PreparedBatch, results: dict[int, Any],
                 opts: RunOptions) -> list[RowRecord]:
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
        oc.stop_reasons.append(res.stop_reason)
        oc.tokens.append(len(res.tokens))
        oc.sampler.append(res.diagnostics.to_dict())
        if res.stop_reason in _ABORTS:
            err = getattr(res.diagnostics, "error", None)
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
        try:
            audio = _code2wav(stages, live, results, opts, outcomes)
        except Exception as exc:  # retry row by row: an exception fails only the rows that raise it alone
            for rid in dict.fromkeys(rid for _, rid, _ in live):
                mine = [x for x in live if x[1] == rid]
                try:
                    audio.update(_code2wav(stages, mine, results, opts, outcomes))
                except Exception as exc_row:
                    outcomes[rid].fail_exc("code2wav", exc_row,
                                           note=f" (the batch raised {type(exc).__name__}: {exc})")
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
            oc.audio_seconds = len(wav) / sr
        records.append(RowRecord(row_id=row.id, wav=wav, diagnostics=oc.to_dict()))
    return records


def talker_with_checkpoint(stages: Stages, segments: Sequence[tuple[str, Any]], dec: Any,
                            outcomes: dict[str, RowOutcome]) -> dict[int, Any]:
    """:func:`generate_isolated`, skipping segments whose talker result the stage-0 checkpoint holds
    (``stages.token_store``) and storing the fresh ones, so a row that fails later keeps its tokens."""
    results, todo = stored_results(stages, segments, range(len(segments)))
    fresh = generate_isolated(stages, [segments[i] for i in todo], dec, outcomes)
    for j, res in fresh.items():
        results[todo[j]] = res
        store_result(stages, segments[todo[j]], res)
    return results


def stored_results(stages: Stages, segments: Sequence[tuple[str, Any]],
                    wanted: Iterable[int]) -> tuple[dict[int, Any], list[int]]:
    """The stage-0 checkpoint's results for the ``wanted`` segment indices, and the indices it lacks."""
    store = stages.token_store
    results: dict[int, Any] = {}
    todo: list[int] = []
    for i in wanted:
        rid, req = segments[i]
        hit = store.get(rid, req.segment) if store is not None else None
        if hit is not None:
            results[i] = hit
        else:
            todo.append(i)
    return results, todo


def store_result(stages: Stages, segment: tuple[str, Any], result: Any) -> None:
    """Keep a fresh talker result in the stage-0 checkpoint (when the run has one)."""
    if stages.token_store is not None:
        stages.token_store.put(segment[0], segment[1].segment, result)


def _segment_record(req: Any) -> dict[str, Any]:
    """What the LLM read for one segment, for the row record (a bad row traces to its text)."""
    ids = getattr(req, "text_ids", None)
    target = int(getattr(req, "target_len", 0) or 0)
    total = int(ids.numel()) if isinstance(ids, torch.Tensor) else target
    return {"text": getattr(req, "segment_text", ""), "text_ids": target, "prompt_ids": max(0, total - target)}


def is_out_of_memory(exc: BaseException) -> bool:
    """True for a device (or host allocator) out-of-memory error, whatever the backend calls it."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def generate_isolated(stages: Stages, segments: Sequence[tuple[str, Any]], dec: Any,
                       outcomes: dict[str, RowOutcome]) -> dict[int, Any]:
    """The talker over ``segments`` -> {segment index: result}, with failures confined.

    Out of memory halves the batch and retries each half (down to one segment, which then fails
    its row); any other batch-level exception retries segment by segment, so only the segments that
    raise alone fail their rows. A row's tokens do not depend on its batch-mates, so the retries
    give the same audio as the whole batch would have.
    """
    from .conditioning import to_talker_request
    from .talker.decode import generate

    def attempt(idx: list[int]) -> dict[int, Any]:
        outs = generate(stages.talker, [to_talker_request(segments[i][1]) for i in idx], dec)
        return dict(zip(idx, outs, strict=True))

    def solve(idx: list[int]) -> dict[int, Any]:
        idx = [i for i in idx if outcomes[segments[i][0]].status == "ok"]
        if not idx:
            return {}
        try:
            return attempt(idx)
        except Exception as exc:
            if len(idx) > 1 and is_out_of_memory(exc):
                if stages.policy.device.type == "cuda":
                    torch.cuda.empty_cache()
                half = len(idx) // 2
                return {**solve(idx[:half]), **solve(idx[half:])}
            if len(idx) == 1:
                outcomes[segments[idx[0]][0]].fail_exc("talker", exc)
                return {}
            found: dict[int, Any] = {}
            for i in idx:  # isolate: only the segments that raise alone fail their rows
                if outcomes[segments[i][0]].status != "ok":
                    continue  # an earlier segment of this row already failed alone
                try:
                    found.update(attempt([i]))
                except Exception as exc_row:
                    outcomes[segments[i][0]].fail_exc(
                        "talker", exc_row, note=f" (the batch raised {type(exc).__name__}: {exc})")
            return found

    return solve(list(range(len(segments))))


def _frames_after_speed(frames: int, speed: float) -> int:
    from .code2wav.token2wav import speed_frames

    return speed_frames(frames, speed)


def _check_audio(oc: RowOutcome, wav: np.ndarray, policy: str) -> np.ndarray:
    """Count a segment's NaN/inf samples; fail the row (``fail``) or zero them as LEGACY did (``zero``)."""
    finite = np.isfinite(wav)
    bad = int(wav.size - np.count_nonzero(finite))
    if not bad:
        return wav
    oc.nonfinite_audio_samples += bad
    if policy == "zero":
        return np.nan_to_num(wav, nan=0.0, posinf=1.0, neginf=-1.0)
    n_nan = int(np.isnan(wav).sum())
    oc.fail("code2wav", NONFINITE_AUDIO, f"nonfinite_audio: {bad} of {wav.size} samples of a segment are not "
                                          f"finite ({n_nan} NaN, {bad - n_nan} inf); --nonfinite-audio zero "
                                          "writes them as 0 / +-1 instead")
    return wav


def _code2wav(stages: Stages, live: Sequence[tuple[int, str, Any]], results: dict[int, Any], opts: RunOptions,
              outcomes: dict[str, RowOutcome]) -> dict[int, np.ndarray]:
    """Batched token2wav over ``live`` (segment index, row id, Request) -> {segment index: float32 wave}.

    Each segment is changed to its own ``speed``; flow and HiFT time is shared out per segment.
    """
    from .code2wav.token2wav import token2wav

    items = [(r, results[i].tokens) for i, _, r in live]
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
    for _, rid, _ in live:
        outcomes[rid].seconds["flow"] = outcomes[rid].seconds.get("flow", 0.0) + res.flow_seconds / len(items)
        outcomes[rid].seconds["hift"] = outcomes[rid].seconds.get("hift", 0.0) + res.hift_seconds / len(items)
    return {i: w.numpy().astype(np.float32, copy=False) for (i, _, _), w in zip(live, res.wavs, strict=True)}


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
    """Rows sorted by estimated length (stable, so deterministic) and cut into batches of similar
    length, returned longest batch first.

    A batch holds at most ``batch_size`` rows and, with ``token_budget``, at most as many rows as
    keep ``len(batch) * max(row_cost)`` (its padded work) within the budget; a single row over the
    budget still gets a batch of its own. Longest first because a run's tail should be its
    shortest work (longest-processing-time-first): the continuous talker then keeps its slots full
    until the end (at the released geometry, 64 rows of 20-400 tokens in 8 slots, ascending order
    left 1308 decode steps for 1095 steps' worth of tokens, longest first 1116), Ray actors' last
    tasks are short, and a batch too big for the device fails in the first minutes, not the last.
    """
    from .batching import chunks_by_length

    by_line = sorted(rows, key=lambda r: r.line)  # ties in cost break by manifest line
    chunks = chunks_by_length([row_cost(r) for r in by_line], token_budget or 0, max_rows=max(1, batch_size))
    return [[by_line[i] for i in chunk] for chunk in reversed(chunks)]


def run(stages: Stages, rows: Sequence[ManifestRow], opts: RunOptions,
        submit: Callable[[RowRecord], None],
        progress: Callable[[RowRecord], None] | None = None, *, prefetch: bool = True) -> list[RowRecord]:
    """Synthesize ``rows``, handing each record to ``submit`` (the writer) as soon as its batch is done.

    ``progress`` is called once per finished row with its record (after ``submit``). The returned
    records keep their diagnostics but not their audio (the writer has it).

    Rows are planned into length-sorted batches (:func:`plan_batches`): the unit of the frontend
    and of code2wav. ``opts.schedule`` says how they reach the talker: ``static`` runs each batch
    through every stage before the next; ``continuous`` (:class:`cosyclone.stream.ContinuousStream`) keeps one talker session
    for the run, adds the next batch's segments while a slot could take them, and sends a batch to
    code2wav as soon as its last segment has left the talker. A row's tokens do not depend on its
    slot mates and code2wav sees the same batches either way, so both give the same WAV bytes.

    With ``prefetch`` one worker thread runs the frontend of the next batch (and only that one:
    queue depth 1) while the models work, so they do not wait on prompt audio, ONNX and
    tokenization. The frontend is deterministic and per row, so the records are the same either
    way; if the worker's batch raises outside its per-row guards, the batch is prepared again on
    this thread as it would have been without prefetch.
    """
    out: list[RowRecord] = []

    def emit(records: Sequence[RowRecord]) -> None:
        for rec in records:
            rec.diagnostics["wav"] = f"wavs/{rec.row_id}.wav" if rec.wav is not None else None
            submit(rec)
            out.append(RowRecord(row_id=rec.row_id, wav=None, diagnostics=rec.diagnostics))
            if progress is not None:
                progress(rec)

    batches = plan_batches(rows, opts.batch_size, opts.token_budget)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-frontend") as pool:
        frontend = FrontendPrefetch(pool, stages, batches, opts, enabled=prefetch)
        try:
            if opts.schedule == "static":
                for k, batch in enumerate(batches):
                    emit(synthesize_batch_isolated(stages, batch, opts, frontend.take(k)))
            else:
                from .stream import ContinuousStream

                ContinuousStream(stages, batches, opts, frontend, emit).run()
        finally:
            frontend.cancel()
    return out


class FrontendPrefetch:
    """The frontend one batch ahead on a worker thread: :meth:`take` of batch k starts batch k + 1."""

    def __init__(self, pool: ThreadPoolExecutor, stages: Stages, batches: Sequence[Sequence[ManifestRow]],
                 opts: RunOptions, *, enabled: bool) -> None:
        self.pool, self.stages, self.batches, self.opts, self.enabled = pool, stages, batches, opts, enabled
        self.ahead: tuple[int, Future[PreparedBatch]] | None = None
        if enabled and batches:
            self.ahead = (0, pool.submit(prepare_batch, stages, batches[0], opts))

    def take(self, k: int) -> PreparedBatch | None:
        """Batch ``k``'s frontend output if it was prepared ahead (None: prepare it on this thread)."""
        prepared = None
        if self.ahead is not None and self.ahead[0] == k:
            prepared = _result_or_none(self.ahead[1])
            self.ahead = None
        if self.enabled and k + 1 < len(self.batches):
            self.ahead = (k + 1, self.pool.submit(prepare_batch, self.stages, self.batches[k + 1], self.opts))
        return prepared

    def cancel(self) -> None:
        if self.ahead is not None:
            self.ahead[1].cancel()


def _result_or_none(ahead: Future[PreparedBatch] | None) -> PreparedBatch | None:
    """The prefetched batch, or None (no prefetch, or it raised: the caller prepares it again)."""
    if ahead is None:
        return None
    try:
        return ahead.result()
    except Exception:
        return None


def synthesize_batch_isolated(stages: Stages, batch: Sequence[ManifestRow], opts: RunOptions,
                         prepared: PreparedBatch | None = None) -> list[RowRecord]:
    """:func:`synthesize_batch`, and if it raises (a bug outside the stages' own guards), each row
    alone (its frontend run again); a row that still raises becomes a failed record with its
    traceback, never a dead run."""
    try:
        return synthesize_batch(stages, batch, opts, prepared)
    except Exception as exc:
        return rows_alone(stages, batch, opts, exc)


def rows_alone(stages: Stages, batch: Sequence[ManifestRow], opts: RunOptions,
                exc: BaseException) -> list[RowRecord]:
    """Each row of a batch that raised, through every stage alone; a row that still raises is a
    failed record with its traceback."""
    records = []
    for row in batch:
        try:
            records.extend(synthesize_batch(stages, [row], opts))
        except Exception as exc_row:
            oc = RowOutcome(row_id=row.id, line=row.line, seed=row_seed_of(opts.seed, row))
            oc.fail_exc("pipeline", exc_row, note=f" (the batch raised {type(exc).__name__}: {exc})")
            records.append(RowRecord(row_id=row.id, wav=None, diagnostics=oc.to_dict()))
    return records


def model_paths_hint(model_dir: Path | None) -> str:
    return str(model_dir) if model_dir is not None else "<dummy: released geometry>"
