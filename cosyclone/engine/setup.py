"""From options to a runnable engine: the model configuration and the options resolved once.

Why here, once: ``auto`` device, dtype, CPU GEMM library and CUDA graphs resolved in several places
drift apart (a door that skips one runs without CUDA graphs). Every door (``synth``, ``say``, the
API, each Ray actor) resolves through :func:`resolve_options`, so they record the same resolved
options for the same inputs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from cosyclone.base.device import DevicePolicy
from cosyclone.errors import CosycloneError
from cosyclone.model.config import ModelConfig
from cosyclone.options import CpuGemm, DeviceName, DtypeName, LoadFormat, RunOptions, check

LOAD_FORMATS = ("auto", "dummy")


def model_config(model_dir: str | Path | None, load_format: LoadFormat = "auto") -> ModelConfig:
    """The :class:`~cosyclone.model.config.ModelConfig` to run: a model directory's, or the released
    geometry for ``load_format="dummy"`` without one (random weights, nothing read)."""
    from cosyclone.model.config import load_model_config, released_config

    if load_format not in LOAD_FORMATS:
        raise CosycloneError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, not {load_format!r}")
    if model_dir is not None:
        return load_model_config(model_dir)
    if load_format != "dummy":
        raise CosycloneError("give a model directory (--model-dir DIR or COSYCLONE_MODEL_DIR), "
                             "or load_format dummy (--load-format dummy) for random weights at released size")
    return released_config()


def resolve_options(opts: RunOptions, *, cfg: ModelConfig | None = None,
                    free_bytes: int | None = None) -> tuple[RunOptions, DevicePolicy]:
    """``opts`` with device, dtype, CPU GEMM library, CUDA graphs and batch size resolved (never ``auto`` or
    None; the prompt workers stay as given: they follow each machine's cores), and the
    :class:`~cosyclone.base.device.DevicePolicy` every builder takes. Idempotent: resolving a resolved set
    gives it back. Sets the process's thread counts (``threads``; the ONNX sessions take the prompt workers'
    ``frontend_threads``).

    The batch size is resolved before any weight is loaded (a run plans its batches first): on CPU
    8, on an accelerator :func:`~cosyclone.engine.sizing.plan_sizing` from ``free_bytes`` (default:
    the free memory now less the weights the load will take, of ``cfg`` or the released geometry).
    """
    from cosyclone.base.device import backend_name, resolve, set_threads
    from cosyclone.engine.sizing import dry_run_sizing, plan_sizing
    from cosyclone.frontend.onnx import set_intra_op_threads
    from cosyclone.model.config import released_config
    from cosyclone.talker.graphs import resolve_cuda_graphs

    check(opts)
    # ROCm runs as cuda
    device = "rocm" if opts.device == "cuda" and backend_name() == "rocm" else opts.device
    policy = resolve(device, opts.dtype, opts.cpu_gemm)
    set_threads(opts.threads)
    geometry = cfg if cfg is not None else released_config()
    if policy.device.type == "cpu" or free_bytes is not None or opts.batch_size is not None:
        sizing = plan_sizing(geometry, policy, opts, free_bytes=free_bytes if free_bytes is not None else 0)
    else:
        sizing = dry_run_sizing(geometry, policy, opts)
    # the ONNX sessions (speech tokenizer, CAM++) the workers run
    set_intra_op_threads(sizing.frontend_threads)
    graphs = resolve_cuda_graphs(opts.cuda_graphs, policy.device, draw=opts.draw)
    # the policy's words are the options' own vocabularies (device.resolve accepts no other), so the
    # narrowing casts below hold by construction; check() runs again as the replaced options are built
    resolved = replace(
        opts,
        device=cast(DeviceName, policy.device.type),
        dtype=cast(DtypeName, policy.dtype_name),
        cpu_gemm=cast(CpuGemm, policy.cpu_gemm),
        cuda_graphs=graphs.value,
        batch_size=sizing.batch_size,
    )
    return resolved, policy


def recorded_options(opts: RunOptions, cfg: ModelConfig) -> dict[str, Any]:
    """``opts`` as a run record holds them: each ``None`` that stands for a default is that default.

    Why: a record is read to reproduce or compare runs, and ``"top_k": null`` says nothing about
    what the sampler used. The values come from where the run takes them (the model yaml, the
    official length ratios, torch's thread count, the sizing rule); what stays ``None`` means
    "none" (``token_budget``, ``max_tokens``, ``min_tokens``) or a size the run settles per batch
    (``talker_slots``: a batch's worth). The fingerprint keeps the options as given
    (:func:`cosyclone.options.audio_values`), so recording them resolved redoes no row.
    """
    import torch

    from cosyclone.engine.sizing import GPU_MEMORY_FRACTION, frontend_plan
    from cosyclone.options import as_record

    gpu = opts.device not in ("cpu", "auto")
    workers, threads_each = frontend_plan(opts, gpu=gpu)
    sampling = cfg.talker.sampling
    defaults: dict[str, Any] = {
        "top_p": sampling.top_p, "top_k": sampling.top_k, "win_size": sampling.win_size,
        "tau_r": sampling.tau_r,
        "min_len_ratio": cfg.talker.min_len_ratio, "max_len_ratio": cfg.talker.max_len_ratio,
        "n_timesteps": cfg.flow.cfm.n_timesteps, "threads": torch.get_num_threads(),
        "frontend_workers": workers, "frontend_threads": threads_each,
        "gpu_memory_fraction": GPU_MEMORY_FRACTION, "code2wav_thread": gpu}
    return {name: defaults.get(name) if value is None and name in defaults else value
            for name, value in as_record(opts).items()}
