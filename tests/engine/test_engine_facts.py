"""What the engine reports about itself (``Engine.facts()``: dtypes per stage, sizes, graphs, peak
memory), and the code2wav budgets and ROCm buckets a sized run hands token2wav: on CPU the same
bytes as the defaults; buckets move a row's audio by float rounding only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from cosyclone.base.memory import read_peaks, reset_peaks
from cosyclone.code2wav.token2wav import token2wav
from cosyclone.options import RunOptions


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Any:
    from cosyclone.engine import Engine

    return Engine.load(tiny_model_dir, RunOptions(device="cpu", max_tokens=6, n_timesteps=1))


def test_an_engine_names_each_stages_dtype_its_sizes_graphs_and_peak_memory(engine: Any) -> None:
    facts = engine.facts()
    assert (facts.device, facts.backend, facts.dtype) == ("cpu", "cpu", "fp32")
    assert facts.stage_dtypes == {"talker": "fp32", "flow": "fp32", "hift": "fp32"}
    assert not facts.sizing.sized and facts.sizing.batch_size == 8 and facts.sizing.hift_max_frames == 200
    assert facts.graphs.resolved == "off" and facts.graphs.disabled is None
    assert facts.peak.host_rss_bytes > 100e6 and facts.peak.gpu_allocated_bytes is None
    record = json.loads(json.dumps(facts.as_record()))  # what runs.jsonl can hold as it is
    assert record["stage_dtypes"]["hift"] == "fp32" and record["peak_memory"]["gpu_reserved_bytes"] is None
    assert record["sizing"]["frontend_workers"] >= 1 and record["graphs"]["captures"] == 0
    text = "\n".join(facts.describe())
    assert "engine: cpu fp32 (talker fp32, flow fp32, hift fp32)" in text and "peak memory: host" in text


def _resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_peak_memory_covers_what_is_resident_and_can_start_afresh() -> None:
    """The host peak is at least what the process holds now, a fresh large allocation included. (Where
    the kernel lets ``reset_peaks`` restart VmHWM the peak then follows the allocation; in a container
    that refuses clear_refs it stays the process's peak, which still covers it.)"""
    reset_peaks("cpu")
    big = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB touched: a fresh mapping, resident
    assert read_peaks("cpu").host_rss_bytes >= _resident_bytes() >= 64 << 20
    del big
    assert read_peaks(None).gpu_allocated_bytes is None


def _inputs(cfg: Any, lens: list[int]) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    b, n, p = len(lens), max(lens), 6
    return {
        "token": torch.randint(0, cfg.flow.vocab_size, (b, n), generator=g),
        "token_len": torch.tensor(lens),
        "prompt_token": torch.randint(0, cfg.flow.vocab_size, (b, p), generator=g),
        "prompt_token_len": torch.full((b,), p),
        "prompt_feat": torch.randn(b, 2 * p, 80, generator=g),
        "embedding": torch.randn(b, 192, generator=g),
    }


def test_budgets_given_explicitly_equal_the_cpu_defaults_byte_for_byte(engine: Any) -> None:
    """A GPU run hands token2wav its sized budgets; the code path with a budget is the CPU's own, so
    the CPU defaults given explicitly write the very bytes of the defaults."""
    x = _inputs(engine.cfg, [9, 4, 13, 7])
    st = engine.stages
    plain = token2wav(st.flow, st.hift, **x, n_timesteps=1)
    given = token2wav(st.flow, st.hift, **x, n_timesteps=1, flow_max_tokens=1400, hift_max_frames=200)
    small = token2wav(st.flow, st.hift, **x, n_timesteps=1, flow_max_tokens=20, hift_max_frames=30)
    assert [w.numpy().tobytes() for w in given.wavs] == [w.numpy().tobytes() for w in plain.wavs]
    for a, b in zip(small.wavs, plain.wavs, strict=True):  # other chunks: float rounding only
        assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-5)


def test_rocm_buckets_pad_the_shapes_and_move_audio_by_rounding_only(engine: Any) -> None:
    st = engine.stages
    x = _inputs(engine.cfg, [9, 4, 13, 7])
    seen: list[int] = []
    real = type(st.flow).inference

    def spy(self: Any, *a: Any, **k: Any) -> Any:
        seen.append(int(k.get("pad_to", 0)))
        return real(self, *a, **k)

    plain = token2wav(st.flow, st.hift, **x, n_timesteps=1)
    try:
        type(st.flow).inference = spy
        padded = token2wav(st.flow, st.hift, **x, n_timesteps=1, flow_max_tokens=40, hift_max_frames=60,
                           flow_bucket=16, hift_bucket=32)
    finally:
        type(st.flow).inference = real
    assert seen and all(s % 16 == 0 for s in seen)  # every flow call padded to the bucket
    for a, b in zip(padded.wavs, plain.wavs, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-5)


def test_a_sized_run_decodes_with_the_sized_slots_and_hands_code2wav_its_budgets(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine wires a GPU-style sizing through (forced here on CPU): the continuous session takes
    the sized slot count and reserves the sized cache, code2wav gets the budgets; the tokens are
    the CPU defaults' and the audio moves by float rounding only."""
    from dataclasses import replace

    from cosyclone.code2wav import token2wav as T
    from cosyclone.engine import Engine
    from cosyclone.manifest import rows_from_dicts

    root = Path(__file__).resolve().parents[2]
    rows = rows_from_dicts(
        [
            {
                "id": f"r{i}",
                "prompt_audio": str(root / "manifests" / "prompts" / "speaker2.wav"),
                "prompt_text": "reference words",
                "text": t,
            }
            for i, t in enumerate(["Hello there.", "Short.", "One more line.", "The end."])
        ]
    ).rows
    opts = replace(engine.opts, batch_size=2)
    plain = Engine(engine.stages, opts)
    want = list(plain.run(rows))
    sized = Engine(engine.stages, opts)
    sized.sizing = replace(sized.sizing, sized=True, talker_slots=3, hift_max_frames=30, flow_max_tokens=20,
                           reserve_positions=64)
    seen: list[dict] = []
    real = T.token2wav

    def spy(*a: Any, **k: Any) -> Any:
        seen.append({n: k.get(n) for n in ("flow_max_tokens", "hift_max_frames")})
        return real(*a, **k)

    monkeypatch.setattr(T, "token2wav", spy)
    got = list(sized.run(rows))
    # CPU: a batch's worth
    assert sized.facts().talker_slots_used == 3 and plain.facts().talker_slots_used == 2
    assert seen and all(s == {"flow_max_tokens": 20, "hift_max_frames": 30} for s in seen)
    for a, b in zip(got, want, strict=True):
        assert a.tokens == b.tokens and a.audio is not None and b.audio is not None
        assert a.audio.shape == b.audio.shape and float(abs(a.audio - b.audio).max()) < 1e-4
