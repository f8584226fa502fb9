"""``bench_talker --occupancy``: the three step timings the done-when reads, on a tiny geometry."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.bench_talker import _occupied_step, occupancy
from cosyclone.base.device import DevicePolicy
from cosyclone.model.config import released_config
from cosyclone.talker.model import build_talker
from tests.talker.test_talker_decode import CFG


def test_occupancy_times_each_shape_over_the_bucket_a_session_would_use() -> None:
    import torch

    cfg = replace(released_config(), talker=CFG)
    lines: list[str] = []
    out = occupancy(lines.append, rounds=1, cells=8, cfg=cfg)
    assert set(out) == {"step_ms_slots16", "step_ms_live16_of256", "step_ms_live256",
                        "ratio_live16_of256_to_slots16"}
    assert all(v > 0 for v in out.values())
    assert "16 live of 256 slots, bucket 16" in "\n".join(lines)
    model = build_talker(cfg, DevicePolicy(torch.device("cpu"), torch.float32, "cpu"), load_format="dummy")
    step, key = _occupied_step(model, 256, 16, 8)
    step.step(key)
    assert bool(step.state.running[:16].all()) and not bool(step.state.running[16:].any())
    assert step.cache.lengths[:16].tolist() == [9] * 16 and step.cache.lengths[16:].sum() == 0
