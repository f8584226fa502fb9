"""The sizing rule (``cosyclone/engine/sizing.py``): CPU keeps its measured defaults; on an accelerator
slots, batch rows and code2wav budgets follow from a free-memory figure (made up here: the rule is
pure, so no GPU is needed to pin it), and the engine reports what it chose."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cosyclone.base.device import DevicePolicy, resolve
from cosyclone.code2wav.hift import CPU_CHUNK_FRAMES
from cosyclone.code2wav.token2wav import FLOW_CPU_CHUNK_TOKENS
from cosyclone.engine import sizing
from cosyclone.engine.sizing import frontend_plan, kv_bytes_per_position, plan_sizing
from cosyclone.model.config import released_config
from cosyclone.options import RunOptions

GIB = 1 << 30
CFG = released_config()


def _n(value: int | None) -> int:
    """A size a GPU plan always has (None only on CPU)."""
    assert value is not None
    return value


def _gpu(
    backend: str = "cuda", dtype: torch.dtype = torch.float32, flow: torch.dtype | None = torch.bfloat16
):
    """A CUDA/ROCm policy as resolve() makes it on a GPU (no GPU is touched: sizing reads no device)."""
    return DevicePolicy(device=torch.device("cuda"), dtype=dtype, backend=backend, flow_dtype=flow)


def test_cpu_keeps_its_defaults_whatever_memory_there_is() -> None:
    cpu = resolve("cpu", "fp32")
    for free in (None, 1, 10**12):
        s = plan_sizing(CFG, cpu, RunOptions(), free_bytes=free)
        assert (s.sized, s.batch_size, s.talker_slots, s.reserve_positions) == (False, 8, None, None)
        assert (s.hift_max_frames, s.flow_max_tokens, s.hift_bucket, s.flow_bucket) == (200, 1400, 0, 0)
    # the defaults named here are the stages' own CPU chunk sizes
    assert (sizing.CPU_HIFT_FRAMES, sizing.CPU_FLOW_TOKENS) == (CPU_CHUNK_FRAMES, FLOW_CPU_CHUNK_TOKENS)
    assert "CPU defaults" in "\n".join(s.describe())


def test_a_kv_cell_is_derived_from_the_config() -> None:
    """layers x KV heads x head dim x (K, V) x dtype bytes: 24 x 2 x 64 x 2 x 2 = 12 KiB in bf16."""
    assert kv_bytes_per_position(CFG, torch.bfloat16) == 12 * 1024
    assert kv_bytes_per_position(CFG, torch.float32) == 24 * 1024


def _rule(free: int, policy: DevicePolicy, opts: RunOptions, frontend: int = 0) -> tuple[int, int, int, int]:
    """The documented rule, spelled out: (slots, hift frames, flow tokens, batch rows)."""
    fraction = opts.gpu_memory_fraction or sizing.GPU_MEMORY_FRACTION
    usable = int(free * fraction) - sizing.RESERVE_BYTES - frontend
    positions = sizing.slot_positions(CFG, opts)
    per_slot = positions * kv_bytes_per_position(CFG, policy.dtype) + 64 * CFG.talker.decoder_size
    per_position = sizing.prefill_bytes_per_position(CFG)
    usable -= max(positions, int(usable * sizing.PREFILL_SHARE) // per_position) * per_position
    slots = max(1, min(sizing.MAX_SLOTS, int(usable * sizing.TALKER_SHARE) // per_slot))
    half = (usable - slots * per_slot) // 2
    hift = max(1500, half // sizing.HIFT_BYTES_PER_FRAME)
    flow = max(1500, half // sizing.FLOW_BYTES_PER_TOKEN["bf16"])
    return slots, hift, flow, max(1, min(slots, hift // 1500, flow // 1500))


@pytest.mark.parametrize("free_gib", [4, 12, 24, 76, 135])
def test_on_a_gpu_the_sizes_follow_the_free_memory(free_gib: int) -> None:
    policy, opts = _gpu(), RunOptions()
    s = plan_sizing(CFG, policy, opts, free_bytes=free_gib * GIB, frontend_bytes=0)
    assert s.sized and (s.talker_slots, s.hift_max_frames, s.flow_max_tokens, s.batch_size) == _rule(
        free_gib * GIB, policy, opts)
    assert s.reserve_positions == sizing.slot_positions(CFG, opts) == 2560 and s.free_bytes == free_gib * GIB
    slots = _n(s.talker_slots) * (
        _n(s.reserve_positions) * s.kv_bytes_per_position + 64 * CFG.talker.decoder_size
    )
    c2w = (s.hift_max_frames * sizing.HIFT_BYTES_PER_FRAME
           + s.flow_max_tokens * sizing.FLOW_BYTES_PER_TOKEN["bf16"])
    if free_gib >= 12:  # above the one-design-row minimums, what is planned fits what was usable
        prefill = _n(s.prefill_tokens) * sizing.prefill_bytes_per_position(CFG)
        assert slots + prefill + c2w <= _n(s.usable_bytes)
    text = "\n".join(s.describe())
    assert f"{free_gib}.0 GiB free" in text and f"talker slots {s.talker_slots}" in text


def test_an_80_gb_card_gets_many_slots_and_a_full_code2wav_batch() -> None:
    s = plan_sizing(CFG, _gpu(), RunOptions(), free_bytes=76 * GIB)
    assert s.talker_slots == sizing.MAX_SLOTS  # 256 slots x 2560 positions x 24 KiB = 15 GiB of fp32 cache
    assert s.batch_size >= 32 and s.hift_max_frames >= 32 * 1500  # 32 rows of 30 s per HiFT call at least


def test_more_memory_never_gives_smaller_sizes() -> None:
    sizes = [plan_sizing(CFG, _gpu(), RunOptions(), free_bytes=g * GIB) for g in (3, 6, 12, 24, 48, 96)]
    for a, b in zip(sizes, sizes[1:], strict=False):
        assert _n(b.talker_slots) >= _n(a.talker_slots) and b.hift_max_frames >= a.hift_max_frames
        assert b.flow_max_tokens >= a.flow_max_tokens and b.batch_size >= a.batch_size


def test_a_small_card_still_runs_one_design_row() -> None:
    s = plan_sizing(CFG, _gpu(), RunOptions(), free_bytes=GIB)  # less than the reserve
    assert (s.usable_bytes, s.talker_slots, s.batch_size) == (0, 1, 1)
    assert s.hift_max_frames == s.flow_max_tokens == sizing.DESIGN_ROW_SECONDS * 50


def test_options_override_the_rule_and_the_fraction_shrinks_it() -> None:
    policy = _gpu()
    s = plan_sizing(CFG, policy, RunOptions(batch_size=3, talker_slots=16), free_bytes=40 * GIB)
    assert (s.batch_size, s.talker_slots) == (3, 16) and s.given == ("talker_slots 16",)
    full = plan_sizing(CFG, policy, RunOptions(), free_bytes=40 * GIB)
    half = plan_sizing(CFG, policy, RunOptions(gpu_memory_fraction=0.45), free_bytes=40 * GIB)
    assert _n(half.usable_bytes) < _n(full.usable_bytes) and _n(half.talker_slots) < _n(full.talker_slots)


def test_bf16_talker_halves_the_cache_per_slot_and_rocm_buckets_its_shapes() -> None:
    fp32 = plan_sizing(CFG, _gpu(), RunOptions(), free_bytes=8 * GIB)
    bf16 = plan_sizing(CFG, _gpu(dtype=torch.bfloat16, flow=None), RunOptions(), free_bytes=8 * GIB)
    assert bf16.kv_bytes_per_position * 2 == fp32.kv_bytes_per_position
    assert _n(bf16.talker_slots) > _n(fp32.talker_slots)
    rocm = plan_sizing(CFG, _gpu(backend="rocm"), RunOptions(), free_bytes=8 * GIB)
    assert (rocm.hift_bucket, rocm.flow_bucket) == (sizing.ROCM_HIFT_BUCKET, sizing.ROCM_FLOW_BUCKET)
    assert (fp32.hift_bucket, fp32.flow_bucket) == (0, 0)


def test_an_accelerator_needs_a_free_memory_figure() -> None:
    with pytest.raises(ValueError, match="free memory"):
        plan_sizing(CFG, _gpu(), RunOptions(), free_bytes=None)


def test_prompt_workers_take_the_cores_torch_leaves() -> None:
    opts = RunOptions()
    # CPU: the models share the cores
    assert frontend_plan(opts, gpu=False, cores=2, torch_threads=2) == (1, 1)
    assert frontend_plan(opts, gpu=False, cores=16, torch_threads=4) == (12, 1)
    # GPU: torch only queues work
    assert frontend_plan(opts, gpu=True, cores=16) == (16 - sizing.GPU_HOST_THREADS, 1)
    assert frontend_plan(replace(opts, threads=6), gpu=True, cores=16) == (10, 1)
    assert frontend_plan(replace(opts, frontend_threads=4), gpu=True, cores=16) == (3, 4)
    assert frontend_plan(replace(opts, frontend_workers=5, frontend_threads=2), gpu=True, cores=16) == (5, 2)


def test_resolving_options_gives_a_batch_size_and_keeps_a_given_one() -> None:
    from cosyclone.engine.setup import resolve_options

    opts, _ = resolve_options(RunOptions(device="cpu"))
    assert opts.batch_size == 8 and resolve_options(opts)[0] == opts  # idempotent
    assert resolve_options(RunOptions(device="cpu", batch_size=3))[0].batch_size == 3


def test_a_dry_run_subtracts_the_weights_in_each_stages_dtype() -> None:
    """Before loading, free memory less the weights: the DiT in bf16 (mixed) weighs less than in fp32."""
    fp32 = sizing.weights_bytes(CFG, resolve("cpu", "fp32"))
    mixed = sizing.weights_bytes(CFG, resolve("cpu", "mixed"))
    assert 2.5e9 < fp32 < 4.5e9 and 0 < fp32 - mixed < fp32 / 2
    assert not sizing.dry_run_sizing(CFG, resolve("cpu", "fp32"), RunOptions()).sized  # CPU: no memory read


def _fake_gpu_memory(
    monkeypatch: pytest.MonkeyPatch, free: int, reserved: int = 0, allocated: int = 0
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_free_memory_counts_the_allocators_idle_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the driver reports free, plus what torch's cache holds with no tensor in it (reused first)."""
    _fake_gpu_memory(monkeypatch, free=10 * GIB, reserved=5 * GIB, allocated=3 * GIB)
    assert sizing.free_device_bytes(torch.device("cuda")) == 12 * GIB
    assert sizing.free_device_bytes(torch.device("cpu")) is None


def test_a_dry_run_on_a_gpu_plans_for_what_the_load_will_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu_memory(monkeypatch, free=40 * GIB)
    policy = _gpu()
    s = sizing.dry_run_sizing(CFG, policy, RunOptions())
    assert s.sized and s.free_bytes == 40 * GIB - sizing.weights_bytes(CFG, policy)
    assert s == plan_sizing(CFG, policy, RunOptions(), free_bytes=s.free_bytes)  # the same rule as after load


def test_the_frontends_gpu_arenas_are_held_back() -> None:
    """The ONNX sessions' arena caps come off the usable memory before anything else is planned, and
    the run records and prints them."""
    policy, opts = _gpu(), RunOptions()
    bare = plan_sizing(CFG, policy, opts, free_bytes=76 * GIB, frontend_bytes=0)
    onnx = plan_sizing(CFG, policy, opts, free_bytes=76 * GIB, frontend_bytes=4 * GIB)
    assert _n(bare.usable_bytes) - _n(onnx.usable_bytes) == 4 * GIB and onnx.frontend_bytes == 4 * GIB
    sizes = (onnx.talker_slots, onnx.hift_max_frames, onnx.flow_max_tokens, onnx.batch_size)
    assert sizes == _rule(76 * GIB, policy, opts, frontend=4 * GIB)
    assert onnx.as_record()["frontend_bytes"] == 4 * GIB
    assert "frontend ONNX arenas 4.0 GiB" in "\n".join(onnx.describe())
    assert plan_sizing(CFG, resolve("cpu", "fp32"), opts).frontend_bytes == 0  # CPU: nothing held back


def test_a_30_s_prompt_with_its_longest_segment_fits_the_reserve_without_growing_the_cache() -> None:
    """The sized cache (allocated up front) holds the longest prompt a run accepts with the longest
    segment the splitter packs and every token it may generate: the session never grows it."""
    from cosyclone.engine.stages import decode_options
    from cosyclone.frontend.text_rules import TOKEN_MAX_N
    from cosyclone.talker import TalkerRequest, TalkerSession
    from tests.talker.test_talker_decode import _model

    fe = CFG.frontend
    opts = RunOptions(max_len_ratio=20.0)  # the released ratio, given: the tiny model below has its own
    s = plan_sizing(CFG, _gpu(), opts, free_bytes=24 * GIB, frontend_bytes=0)
    dec = replace(decode_options(CFG, opts, s), cuda_graphs="off", sampler=None)
    assert dec.reserve_positions == s.reserve_positions and dec.prefill_tokens == s.prefill_tokens
    speech = int(fe.max_prompt_seconds * fe.token_frame_rate)  # 750
    transcript = int(fe.max_prompt_seconds * sizing.PROMPT_TEXT_IDS_PER_SECOND)  # 120
    req = TalkerRequest(row_id="long", text_ids=torch.ones(transcript + TOKEN_MAX_N, dtype=torch.long),
                        target_len=TOKEN_MAX_N, prompt_speech_tokens=torch.ones(speech, dtype=torch.long))
    session = TalkerSession(_model(), dec, slots=2)
    capacity = session.runner.engine.capacity
    assert capacity == s.reserve_positions
    session.add([req])
    seq = session.seqs[0]
    assert seq.cells() == 2 + transcript + TOKEN_MAX_N + speech + 20 * TOKEN_MAX_N <= capacity
    session.poll()  # admitted and a first window decoded
    assert seq.status in ("running", "finished") and session.runner.engine.capacity == capacity  # not grown
    session.close()
    cpu = decode_options(CFG, opts, plan_sizing(CFG, resolve("cpu", "fp32"), opts))
    assert cpu.reserve_positions is None and cpu.prefill_tokens is None  # CPU grows as rows need
