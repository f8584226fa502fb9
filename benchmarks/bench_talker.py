"""Talker decode throughput on full-size dummy weights, next to the official rate and the floor.

The memory-bandwidth floor: a decode step must read every weight that takes part in it (all of
the backbone but ``embed_tokens``, plus ``llm_decoder``; the text ``lm_head`` is never computed),
so ``step_time >= weight_bytes / bandwidth``. Bandwidth is measured in the same run with a large
tensor copy. Official CosyVoice3 decodes at about 9.7 tok/s (BASELINE_CPU.md).

Run: ``python benchmarks/bench_talker.py`` (a few minutes on 2 cores).

``python -m benchmarks.bench_talker --occupancy --json``: a decode step's cost follows the live rows
(:meth:`~cosyclone.talker.step.SlotStep.bucket_view`): one step at 16 live rows of 256 slots, one of a
16-slot session, one at 256 live; the last line is JSON with ``step_ms_live16_of256``,
``step_ms_slots16`` and ``step_ms_live256``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.machine import cpu_name
from cosyclone.base.device import DevicePolicy
from cosyclone.model.config import ModelConfig, released_config
from cosyclone.talker import DecodeOptions, TalkerRequest
from cosyclone.talker.graphs import CudaGraphCapture, GraphedStep
from cosyclone.talker.model import CosyVoice3LM, build_talker
from cosyclone.talker.sampler import SamplerOptions
from cosyclone.talker.scheduler import bucket_for, decode_buckets
from cosyclone.talker.slot_sampler import SlotSampler
from cosyclone.talker.step import SlotStep, StepKey


def _tests():
    """tests/samplers.py and tests/host_session.py (greedy host steps live outside the product),
    importable however this bench runs."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests import host_session, samplers

    return host_session, samplers

OFFICIAL_TOK_S = 9.7
PROMPT_LEN = 127  # assembled prompt length per row
STEPS = 32  # decode steps per row


def measure_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes/s of a large copy (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def step_weight_bytes(model: CosyVoice3LM) -> int:
    """Bytes of weights read by one decode step (everything but the token embedding table)."""
    skip = model.backbone.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not skip)


def _requests(batch: int) -> list[TalkerRequest]:
    g = torch.Generator().manual_seed(0)
    text = PROMPT_LEN - 2 - 50
    return [TalkerRequest(row_id=f"r{i}", text_ids=torch.randint(0, 151000, (text,), generator=g),
                          target_len=STEPS, prompt_speech_tokens=torch.randint(0, 6561, (50,), generator=g))
            for i in range(batch)]


def decode_rate(model: CosyVoice3LM, batch: int) -> float:
    """Aggregate decode tokens/s (prefill timed separately and excluded)."""
    reqs = _requests(batch)
    S = model.cfg.speech_token_size
    marks: dict[int, float] = {}

    def hook(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        marks.setdefault(step, time.perf_counter())
        return logits

    host_session, samplers = _tests()
    host_session.host_generate(model, reqs, DecodeOptions(max_len_override=STEPS + 1),
                               sampler=samplers.GreedySampler([STEPS] * batch, S), logits_hook=hook)
    steps = sorted(marks)
    return batch * (steps[-1] - steps[0]) / (marks[steps[-1]] - marks[steps[0]])


def run(report: Callable[[str], None] = print, batches: tuple[int, ...] = (1, 4, 16)) -> dict[str, float]:
    """Run the benchmark, calling ``report`` with each line; returns the numbers."""
    torch.set_num_threads(2)
    cfg = released_config()
    bw = measure_bandwidth()
    report(
        f"on {cpu_name()}: copy bandwidth {bw / 1e9:.1f} GB/s; official {OFFICIAL_TOK_S} tok/s (measured in "
        f"another run on an Intel Xeon with AMX, not alternated with this one); "
        f"{STEPS} decode steps after a {PROMPT_LEN}-position prompt"
    )
    out: dict[str, float] = {}
    for dtype, sizes in ((torch.float32, batches), (torch.bfloat16, batches)):
        model = build_talker(cfg, DevicePolicy(torch.device("cpu"), dtype, "cpu"), load_format="dummy")
        wb = step_weight_bytes(model)
        floor = bw / wb
        name = "fp32" if dtype == torch.float32 else "bf16"
        report(f"{name}: weights read per step {wb / 1e9:.2f} GB -> floor {floor:.1f} steps/s (batch 1)")
        for b in sizes:
            rate = decode_rate(model, b)
            out[f"{name}_b{b}"] = rate
            report(f"  {name} batch {b:2d}: {rate:7.1f} tok/s = {rate / OFFICIAL_TOK_S:5.2f}x official, "
                   f"{rate / b / floor:4.2f} of the per-row floor ({rate / b:.1f} steps/s)")
        del model
    return out


def _occupied_step(model: CosyVoice3LM, slots: int, live: int, cells: int) -> tuple[SlotStep, StepKey]:
    """A slot step of ``slots`` slots whose first ``live`` rows run with ``cells`` cache cells each (zero
    K/V: the arithmetic of a step does not depend on the values), stop ids blocked, and its shape key,
    the bucket chosen as a session chooses it (the smallest that holds every running row)."""
    cfg = model.cfg
    sampler = SlotSampler(SamplerOptions.from_config(cfg.sampling), slots=slots, vocab=cfg.decoder_size,
                          speech_token_size=cfg.speech_token_size, device=model.device)
    step = SlotStep(model, slots=slots, capacity=cells + 64, token_capacity=64, sampler=sampler)
    idx = torch.arange(live, device=model.device)
    step.cache.lengths[idx] = cells
    step._start(idx, [1 << 30] * live)
    sampler.reset(idx, idx + 1, torch.full((live,), 1 << 30))
    return step, step.shape_key(bucket_for(live, decode_buckets(slots)), cells + 64)


def step_seconds(step: Callable[[], object], device: torch.device, repeat: int = 1) -> float:
    """Seconds of one decode step (the mean of ``repeat`` in a row; a GPU is synchronized around them)."""
    cuda = device.type == "cuda"
    with torch.inference_mode():
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(repeat):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) / repeat


def _timed_call(step: SlotStep, key: StepKey) -> Callable[[], object]:
    """What a run calls per step: on CUDA the step as captured graphs (one per shape), else eager."""
    if step.model.device.type != "cuda":
        return lambda: step.step(key)
    graphed = GraphedStep(step.step, backend=CudaGraphCapture(step.model.device))
    return lambda: graphed(key)


def occupancy(report: Callable[[str], None] = print, *, rounds: int = 5, cells: int = 128,
              device: str = "cpu", dtype: str = "fp32", tf32: bool = False,
              cfg: ModelConfig | None = None) -> dict[str, float]:
    """A decode step's cost at 16 live rows of 256 slots against a 16-slot session's and at 256 live:
    the released talker geometry, dummy weights, the step a session runs (its bucket chosen as the
    session chooses it; captured as a CUDA graph on a GPU, UNVERIFIED there). The three steps
    alternate, ``rounds`` times after an untimed warm-up, each first in turn, and each figure is its
    median: on a shared machine the load drifts. ``dtype``: the backbone's (fp32, the run default, or
    bf16); ``tf32``: TF32 matmuls on CUDA (a run switches them off); ``cfg``: another geometry (tests)."""
    dev = torch.device(device)
    cpu = dev.type == "cpu"
    if cpu:
        torch.set_num_threads(2)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    policy = DevicePolicy(dev, torch.float32 if dtype == "fp32" else torch.bfloat16, dev.type,
                          cpu_gemm="onednn" if cpu else "aten")  # onednn: a CPU run's default
    model = build_talker(cfg or released_config(), policy, load_format="dummy")
    shapes = {"step_ms_slots16": (16, 16), "step_ms_live16_of256": (256, 16), "step_ms_live256": (256, 256)}
    steps = {name: _occupied_step(model, slots, live, cells) for name, (slots, live) in shapes.items()}
    calls = {name: _timed_call(*step) for name, step in steps.items()}
    repeat = 1 if cpu else 20
    for call in calls.values():  # warm-up (and, on CUDA, the captures)
        step_seconds(call, dev, 1 if cpu else 3)
    times: dict[str, list[float]] = {name: [] for name in shapes}
    names = list(steps)
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:  # each goes first in turn (caches, load drift)
            times[name].append(step_seconds(calls[name], dev, repeat))
    out: dict[str, float] = {name: round(1e3 * statistics.median(t), 2) for name, t in times.items()}
    for name, (slots, live) in shapes.items():
        report(f"  {name}: {out[name]:.1f} ms per step ({live} live of {slots} slots, bucket "
               f"{steps[name][1][0]}, {cells} cached cells per row)")
    out["ratio_live16_of256_to_slots16"] = round(out["step_ms_live16_of256"] / out["step_ms_slots16"], 3)
    where = cpu_name() if cpu else torch.cuda.get_device_name(dev)
    report(f"on {where}, {torch.get_num_threads()} threads, released talker geometry, dummy weights, "
           f"{dtype}{' with TF32' if tf32 else ''}; medians of {rounds} alternated rounds")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--occupancy", action="store_true",
                        help="a decode step at 16 live rows of 256 slots, of a 16-slot session, at 256 live")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON on the last line")
    parser.add_argument("--device", default="cpu", help="--occupancy: cpu or cuda")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                        help="--occupancy: the backbone's")
    parser.add_argument("--tf32", action="store_true", help="--occupancy on CUDA: TF32 matmuls")
    parser.add_argument("--rounds", type=int, default=5, help="--occupancy: timed rounds")
    args = parser.parse_args()
    numbers = (occupancy(rounds=args.rounds, device=args.device, dtype=args.dtype, tf32=args.tf32)
               if args.occupancy else run())
    if args.json:
        print(json.dumps(numbers))


if __name__ == "__main__":
    main()
