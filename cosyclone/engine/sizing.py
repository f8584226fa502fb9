"""How big a run's batches, talker slots and code2wav calls are, from the device's free memory.

Why: a talker slot costs memory, not time: a decode step runs over the smallest bucket of slots
that holds its live rows (:mod:`cosyclone.talker.scheduler`), so many slots give the frontend's
rows room to join without making each step compute idle slots; code2wav's activations grow with
rows x length; a fixed ``--batch-size 8`` leaves most of an 80 GB card idle, and HiFT over a whole
256-row batch would need ~90 GB. So on
CUDA/ROCm the sizes come from the memory free after the models are loaded; on CPU the measured
CPU defaults stay (8 rows, a batch's worth of slots, HiFT 200 frames and the flow 1400 token
positions per call), byte for byte as before. :func:`plan_sizing` is pure (a free-memory figure
in, sizes out), so ``--dry-run`` can show the sizes without loading weights and tests can pin the
rule with a made-up figure.

The rule on an accelerator (every constant below says whether it was measured or derived):

1. ``usable = free x fraction - RESERVE_BYTES - frontend`` (``--gpu-memory-fraction``, default 0.9;
   ``frontend``: the arena caps of the speech tokenizer's and CAM++'s sessions when they run on the
   GPU, :func:`cosyclone.frontend.onnx.frontend_device_bytes`).
2. Prefill: ``PREFILL_SHARE`` of ``usable`` (at least one planned prompt) is held for one prefill's
   activations (:func:`prefill_bytes_per_position`); ``prefill_tokens`` padded positions per prefill
   (the scheduler caps each admission by it; one newcomer always goes). Steps 3-4 share the rest.
3. Talker: a slot holds :func:`slot_positions` cache positions (the longest prompt the run accepts plus
   its longest segment: 2,560 at the released config) of ``kv_bytes_per_position`` (layers
   x KV heads x head dim x 2 (K and V) x the talker dtype's bytes: 24 KiB fp32, 12 KiB bf16 at the
   released geometry) plus ``SLOT_STEP_BYTES`` of per-step temporaries; slots = as many as
   ``TALKER_SHARE`` of the rest holds, 1 to ``MAX_SLOTS``.
4. code2wav gets the rest, half each: HiFT frames per call = half / ``HIFT_BYTES_PER_FRAME``, flow
   token positions per call = half / ``FLOW_BYTES_PER_TOKEN[flow dtype]``.
5. Batch rows: how many ``DESIGN_ROW_SECONDS`` rows one HiFT call and one flow call take, 1 to
   the slot count (continuous batching fills the slots from several batches).

A longer row than the design still runs (a cache grows; a chunk of one long row runs alone);
``--batch-size`` and ``--talker-slots`` override the rule. Sizing never changes a row's tokens
(they do not depend on slot mates) and changes code2wav's audio only by float rounding (kernels
chosen by shape), as any batch composition does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from cosyclone.base.device import DevicePolicy, dtype_name
from cosyclone.model.config import ModelConfig
from cosyclone.options import RunOptions

GIB = 1 << 30
#: CPU defaults (measured on an AMD EPYC Zen 4, 2 cores: docs/batching.md, docs/performance.md).
CPU_BATCH_SIZE = 8
CPU_HIFT_FRAMES = 200  # = code2wav.hift.CPU_CHUNK_FRAMES
CPU_FLOW_TOKENS = 1400  # = code2wav.token2wav.FLOW_CPU_CHUNK_TOKENS
#: Share of the free memory sizing may plan for (``--gpu-memory-fraction``).
GPU_MEMORY_FRACTION = 0.9
#: Held back from planning: cuBLAS/cuDNN workspaces, the CUDA graph pool, allocator fragmentation.
#: DERIVED (a guess to be corrected by the first GPU run's peak reserved bytes), not measured.
RESERVE_BYTES = 2 * GIB
#: Prompt transcript text ids per second of prompt speech that a slot is planned for: fast speech is
#: about 3.5 words (English) or 5 characters (Mandarin) a second, about 4 Qwen2 text ids. DERIVED, not
#: measured.
PROMPT_TEXT_IDS_PER_SECOND = 4
#: Cache positions per slot are planned in multiples of this (the decode step's default ``kv_bucket``).
POSITION_BUCKET = 64
#: Per-slot step temporaries: the sampler's (slots, vocab) arrays, about eight of 8 bytes per entry.
#: DERIVED from the config (``decoder_size x 64``), not measured.
SLOT_STEP_BYTES_PER_VOCAB = 64
MAX_SLOTS = 256
#: Share of ``usable`` held for one prefill's activations (the first admission of a run would otherwise
#: prefill every slot at once), at least one slot of :func:`slot_positions`. DERIVED (a guess
#: bounding the prefill's transient memory), not measured.
PREFILL_SHARE = 0.05
#: At most this share of ``usable`` goes to the talker's cache; code2wav gets the rest.
TALKER_SHARE = 0.75
#: HiFT activations per padded mel frame (50 frames per second of audio): fp32, direct convolutions
#: as on a GPU, whole call. MEASURED on CPU (AMD EPYC Zen 4, 2 cores, torch 2.13 CPU) by
#: benchmarks/code2wav_memory.py: 254,652 B/frame (12.7 MB per second of audio; 1 row x 250, 500,
#: 1000 frames and 2 rows x 500, peak RSS with mmap'd temporaries). cuDNN workspaces are not in it.
HIFT_BYTES_PER_FRAME = 254_652
#: Flow activations per padded token position (25 per second of audio; the DiT sees 2 mel frames
#: each, CFG doubles the batch), one Euler step at a time. fp32 MEASURED on CPU as above:
#: 123,952 B/token (3.1 MB per second; 1 row x 175, 275, 475 positions and 2 rows x 275). bf16
#: MEASURED the same way: 111,228 B/token, not half, because the CPU's bf16 path (no AMX) keeps
#: float32 softmax and conversion buffers; a GPU should need about half of fp32, so this is kept as
#: a conservative bound until a GPU run measures it. fp16: DERIVED as bf16. SDPA's CPU path also
#: holds (heads x T x T) scores that flash attention on a GPU does not: upper bounds there.
FLOW_BYTES_PER_TOKEN = {"fp32": 123_952, "bf16": 111_228, "fp16": 111_228}
#: The row length batches are planned for on a GPU: 30 s of speech (the longest prompt), i.e.
#: 1500 mel frames for HiFT and 1500 token positions (prompt + target) for the flow.
DESIGN_ROW_SECONDS = 30
#: ROCm: HiFT frames / flow token positions are padded to multiples of these (MIOpen builds its
#: kernels per shape; a few widths instead of one per batch). 128 frames = 2.56 s, 64 tokens = 2.56 s.
ROCM_HIFT_BUCKET = 128
ROCM_FLOW_BUCKET = 64
#: On a GPU the main thread's torch ops are bookkeeping: the cores beyond these go to prompt workers.
GPU_HOST_THREADS = 2
MAX_FRONTEND_WORKERS = 32


@dataclass(frozen=True)
class Sizing:
    """The sizes a run uses and where they came from (:func:`plan_sizing`)."""

    device: str  # "cpu" | "cuda" | "rocm"
    sized: bool  # True: from free memory (an accelerator); False: the CPU defaults
    batch_size: int  # rows per planned batch (the frontend's and code2wav's unit)
    talker_slots: int | None
    # segments decoded at once; None: the CPU rule (a batch's worth, at most the rows)
    hift_max_frames: int  # padded mel frames per HiFT call
    flow_max_tokens: int  # padded token positions per flow call
    hift_bucket: int  # HiFT widths padded to a multiple of this (0: none; ROCm only)
    flow_bucket: int  # flow positions padded to a multiple of this (0: none; ROCm only)
    reserve_positions: int | None  # cache positions allocated per slot up front (GPU), None: grown as needed
    frontend_workers: int  # prompt workers (threads preparing upcoming rows' prompts)
    frontend_threads: int  # torch and ONNX intra-op threads of each prompt worker
    kv_bytes_per_position: int  # one slot's K and V for one position, all layers (talker dtype)
    prefill_tokens: int | None = None  # padded prompt positions one prefill may take (GPU); None: no cap
    free_bytes: int | None = None  # device memory free when sized (after load); None on CPU
    usable_bytes: int | None = None  # what the rule planned for: free x fraction - reserve
    fraction: float | None = None  # --gpu-memory-fraction as applied
    flow_dtype: str = "fp32"  # the DiT's dtype the flow budget was computed for
    given: tuple[str, ...] = field(default=())
    # the sizes taken from options rather than the rule (--talker-slots)
    frontend_bytes: int = 0  # device memory held back for the frontend's ONNX sessions (their arena caps)

    def describe(self) -> list[str]:
        """What ``--dry-run`` prints: the sizes, and the memory figure they came from."""
        frontend = f"frontend {self.frontend_workers} prompt worker(s) x {self.frontend_threads} thread(s)"
        slots = "a batch's worth (at most the rows)" if self.talker_slots is None else str(self.talker_slots)
        lines = [
            f"sizing ({self.device}): batch {self.batch_size} rows, talker slots {slots}, HiFT "
            f"{self.hift_max_frames} frames and flow {self.flow_max_tokens} token positions per call; "
            f"{frontend}"
        ]
        if not self.sized:
            lines.append("  CPU defaults (measured on CPU: docs/batching.md)")
        else:
            lines.append(
                f"  from {_gib(self.free_bytes)} free x {self.fraction:g} - {_gib(RESERVE_BYTES)} reserve = "
                f"{_gib(self.usable_bytes)}: {self.kv_bytes_per_position // 1024} KiB per slot-position x "
                f"{self.reserve_positions} positions per slot; "
                f"HiFT {HIFT_BYTES_PER_FRAME / 1e3:.0f} kB/frame, "
                f"flow {FLOW_BYTES_PER_TOKEN.get(self.flow_dtype, 0) / 1e3:.0f} kB/token in "
                f"{self.flow_dtype} (docs/batching.md)"
            )
            lines.append(f"  prefill at most {self.prefill_tokens} padded positions per admission; frontend "
                         f"ONNX arenas {_gib(self.frontend_bytes)} (held back)")
        if self.hift_bucket or self.flow_bucket:
            lines.append(
                f"  ROCm: HiFT widths padded to {self.hift_bucket} frames, flow to {self.flow_bucket} tokens"
            )
        if self.given:
            lines.append(f"  as given: {', '.join(self.given)}")
        return lines

    def as_record(self) -> dict[str, Any]:
        """JSON-able form (``runs.jsonl``)."""
        return {"device": self.device, "sized": self.sized, "batch_size": self.batch_size,
                "talker_slots": self.talker_slots, "hift_max_frames": self.hift_max_frames,
                "flow_max_tokens": self.flow_max_tokens, "hift_bucket": self.hift_bucket,
                "flow_bucket": self.flow_bucket, "reserve_positions": self.reserve_positions,
                "frontend_workers": self.frontend_workers, "frontend_threads": self.frontend_threads,
                "kv_bytes_per_position": self.kv_bytes_per_position, "prefill_tokens": self.prefill_tokens,
                "free_bytes": self.free_bytes,
                "usable_bytes": self.usable_bytes, "fraction": self.fraction, "flow_dtype": self.flow_dtype,
                "given": list(self.given), "frontend_bytes": self.frontend_bytes}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def slot_positions(cfg: ModelConfig, opts: RunOptions) -> int:
    """Cache positions a slot is planned for (and allocated up front on a GPU): the longest prompt the
    run accepts (``max_prompt_seconds``: its speech tokens and its transcript's text ids) with its
    longest segment (the splitter's packing bound of text ids) and every token that segment may
    generate (``--max-tokens``, else ``max_len_ratio`` x its text ids), plus sos and the task id;
    rounded up to :data:`POSITION_BUCKET`. 2 + 750 + 120 + 80 + 1600 = 2552 -> 2560 at the released
    config. Why this figure: a row that fits it never grows the cache mid-run (a growth holds the old
    and the new cache at once, outside this rule, and every decode graph is captured again)."""
    from cosyclone.frontend.text_rules import TOKEN_MAX_N

    fe = cfg.frontend
    prompt = int(fe.max_prompt_seconds * fe.token_frame_rate) + int(fe.max_prompt_seconds
                                                                    * PROMPT_TEXT_IDS_PER_SECOND)
    ratio = cfg.talker.max_len_ratio if opts.max_len_ratio is None else float(opts.max_len_ratio)
    generated = int(opts.max_tokens) if opts.max_tokens is not None else int(ratio * TOKEN_MAX_N)
    need = 2 + prompt + TOKEN_MAX_N + generated
    return -(-need // POSITION_BUCKET) * POSITION_BUCKET


def kv_bytes_per_position(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """One slot's K and V for one position in every layer: layers x KV heads x head dim x 2 x bytes."""
    q = cfg.talker.qwen
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return q.num_hidden_layers * q.num_key_value_heads * q.head_dim * 2 * itemsize


def prefill_bytes_per_position(cfg: ModelConfig) -> int:
    """A prefill's live activations per padded position, fp32 (attention that never materializes T x T
    scores): the residual, q/k/v/o (about 6 x hidden) and the MLP's gate, up and product (3 x
    intermediate). DERIVED from the geometry (80 kB at the released one), not measured. The attention's
    scores are bounded apart: on an accelerator the prefill attends in query chunks of at most
    :data:`cosyclone.talker.qwen2.PREFILL_SCORES` scores (256 MiB fp32, about 768 MiB with their softmax
    and mask), which the reserve holds."""
    q = cfg.talker.qwen
    return (6 * q.hidden_size + 3 * q.intermediate_size) * 4


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def frontend_plan(opts: RunOptions, *, gpu: bool, cores: int | None = None,
                  torch_threads: int | None = None) -> tuple[int, int]:
    """(prompt workers, threads each): ``--frontend-threads`` (default 1) and ``--frontend-workers``
    (default: the cores torch leaves, divided by the threads each, at least 1). Torch keeps
    ``--threads`` cores, else all of them on CPU (the models share the cores with the frontend:
    one worker, as before) and :data:`GPU_HOST_THREADS` on a GPU (its main thread only queues work)."""
    threads = int(opts.frontend_threads or 1)
    if opts.frontend_workers:
        return int(opts.frontend_workers), threads
    cores = usable_cores() if cores is None else cores
    if opts.threads:
        busy = int(opts.threads)
    elif gpu:
        busy = GPU_HOST_THREADS
    else:
        busy = torch.get_num_threads() if torch_threads is None else torch_threads
    return max(1, min(MAX_FRONTEND_WORKERS, (cores - busy) // threads)), threads


def plan_sizing(cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions, *, free_bytes: int | None = None,
                cores: int | None = None, torch_threads: int | None = None,
                frontend_bytes: int | None = None) -> Sizing:
    """The run's sizes (see the module docstring). ``free_bytes``: device memory free after load
    (required on an accelerator; ignored on CPU). ``cores``/``torch_threads``: the machine's, by default.
    ``frontend_bytes``: what the frontend's ONNX sessions may take on the device (by default their
    arena caps when this onnxruntime runs them on the run's GPU, else 0)."""
    gpu = policy.device.type != "cpu"
    workers, threads = frontend_plan(opts, gpu=gpu, cores=cores, torch_threads=torch_threads)
    kv = kv_bytes_per_position(cfg, policy.dtype)
    # the batch size is resolved before load (resolve_options) and so always looks given: not named
    given = (f"talker_slots {opts.talker_slots}",) if opts.talker_slots is not None else ()
    if not gpu:
        return Sizing(
            device="cpu",
            sized=False,
            batch_size=int(opts.batch_size or CPU_BATCH_SIZE),
            talker_slots=opts.talker_slots,
            hift_max_frames=CPU_HIFT_FRAMES,
            flow_max_tokens=CPU_FLOW_TOKENS,
            hift_bucket=0,
            flow_bucket=0,
            reserve_positions=None,
            frontend_workers=workers,
            frontend_threads=threads,
            kv_bytes_per_position=kv,
            given=given,
        )
    if free_bytes is None:
        raise ValueError("sizing on an accelerator needs the free memory after load (free_bytes)")
    if frontend_bytes is None:
        from cosyclone.frontend.onnx import frontend_device_bytes

        frontend_bytes = frontend_device_bytes(policy.backend)
    fraction = GPU_MEMORY_FRACTION if opts.gpu_memory_fraction is None else float(opts.gpu_memory_fraction)
    usable = max(0, int(free_bytes * fraction) - RESERVE_BYTES - frontend_bytes)
    positions = slot_positions(cfg, opts)
    per_slot = positions * kv + SLOT_STEP_BYTES_PER_VOCAB * cfg.talker.decoder_size
    prefill_bytes = prefill_bytes_per_position(cfg)  # the prefill's room comes first
    prefill = max(positions, int(usable * PREFILL_SHARE) // prefill_bytes)
    rest = max(0, usable - prefill * prefill_bytes)
    slots = max(1, min(MAX_SLOTS, int(rest * TALKER_SHARE) // per_slot))
    if opts.talker_slots:
        slots = int(opts.talker_slots)
    half = max(0, rest - slots * per_slot) // 2
    flow_dtype = dtype_name(policy.dit_dtype)
    design = DESIGN_ROW_SECONDS * 50  # frames of HiFT = token positions of the flow (prompt + target)
    hift_frames = max(design, half // HIFT_BYTES_PER_FRAME)
    flow_tokens = max(design, half // FLOW_BYTES_PER_TOKEN.get(flow_dtype, FLOW_BYTES_PER_TOKEN["fp32"]))
    batch = max(1, min(slots, hift_frames // design, flow_tokens // design))
    rocm = policy.backend == "rocm"
    return Sizing(
        device=policy.backend,
        sized=True,
        batch_size=int(opts.batch_size or batch),
        talker_slots=slots,
        hift_max_frames=hift_frames,
        flow_max_tokens=flow_tokens,
        hift_bucket=ROCM_HIFT_BUCKET if rocm else 0,
        flow_bucket=ROCM_FLOW_BUCKET if rocm else 0,
        reserve_positions=positions,
        frontend_workers=workers,
        frontend_threads=threads,
        kv_bytes_per_position=kv,
        prefill_tokens=prefill,
        free_bytes=int(free_bytes),
        usable_bytes=usable,
        fraction=fraction,
        flow_dtype=flow_dtype,
        given=given,
        frontend_bytes=frontend_bytes,
    )


def free_device_bytes(device: torch.device) -> int | None:
    """The memory this process can still use on ``device`` (None on CPU): ``torch.cuda.mem_get_info``'s
    free bytes plus the blocks torch's caching allocator holds with no tensor in them (the load's
    temporaries), which the driver counts as used but this process reuses first."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + max(0, cached))


def weights_bytes(cfg: ModelConfig, policy: DevicePolicy) -> int:
    """Bytes the three models' parameters and buffers take on the device in each stage's dtype
    (talker backbone in ``policy.dtype``, its head fp32, the DiT in ``policy.dit_dtype``, HiFT fp32
    with a float64 F0 predictor), counted on the meta device: nothing is allocated. What a dry run
    subtracts from the free memory it reads before loading."""
    from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
    from cosyclone.code2wav.hift import CausalHiFTGenerator, fft_rule_for
    from cosyclone.talker.model import CosyVoice3LM

    with torch.device("meta"):
        talker = CosyVoice3LM(cfg.talker).to(policy.dtype)
        talker.llm_decoder.to(torch.float32)
        flow = CausalMaskedDiffWithDiT(cfg.flow).to(policy.dit_dtype)
        hift = CausalHiFTGenerator(cfg.hift)
        hift.fold_weight_norm(fft=fft_rule_for(policy))
        hift.f0_predictor.double()
    return sum(
        t.numel() * t.element_size() for m in (talker, flow, hift) for t in (*m.parameters(), *m.buffers())
    )


def dry_run_sizing(cfg: ModelConfig, policy: DevicePolicy, opts: RunOptions) -> Sizing:
    """:func:`plan_sizing` before anything is loaded: on an accelerator the free memory now, less
    the weights the load will take (:func:`weights_bytes`)."""
    free = free_device_bytes(policy.device)
    if free is not None:
        free = max(0, free - weights_bytes(cfg, policy))
    return plan_sizing(cfg, policy, opts, free_bytes=free)
