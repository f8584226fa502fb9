"""Talker decode throughput on full-size dummy weights, next to the official rate and the floor.

The memory-bandwidth floor: a decode step must read every weight that takes part in it (all of
the backbone but ``embed_tokens``, plus ``llm_decoder``; the text ``lm_head`` is never computed),
so ``step_time >= weight_bytes / bandwidth``. Bandwidth is measured in the same run with a large
tensor copy. Official CosyVoice3 decodes at about 9.7 tok/s (BASELINE_CPU.md).

Run: ``python benchmarks/bench_talker.py`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.machine import cpu_name
from cosyclone.base.device import DevicePolicy
from cosyclone.model.config import released_config
from cosyclone.talker import DecodeOptions, TalkerRequest
from cosyclone.talker.model import CosyVoice3LM, build_talker


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


def main() -> None:
    run()


if __name__ == "__main__":
    main()
