"""The dtype-agreement benchmark runs end to end on a tiny talker and checks the talker's own
logits against its "now" row (fp32 head on the run-dtype hidden state), bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks import bench_dtype_agreement
from cosyclone.engine.tiny import TinySizes, write_tiny_config
from cosyclone.model.config import load_model_config


def test_agreement_benchmark_on_a_tiny_talker(tmp_path: Path) -> None:
    cfg = load_model_config(
        write_tiny_config(tmp_path / "m", TinySizes(text_vocab=300, speech_token_size=60))
    )
    lines: list[str] = []
    out = bench_dtype_agreement.run(
        lines.append, rows=2, steps=6, dtypes=(torch.bfloat16,), head_scales=(1.0,), cfg=cfg
    )
    assert len(out) == 6 and all(0.0 <= v <= 1.0 for v in out.values())
    assert any("fp32 head (now)" in line for line in lines)
    assert set(out) >= {
        "bf16 backbone, fp32 head (now) x1 greedy",
        "fp32 backbone, bf16 head (the head's share) x1 sampled",
    }
