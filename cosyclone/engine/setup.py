"""From options to a runnable engine: the model configuration and the options resolved once.

Why here, once: ``auto`` device, dtype, CPU GEMM library and CUDA graphs used to be resolved in
three places (and not at all by the API, so ``say`` and the API never used CUDA graphs while
``synth`` did). Every door (``synth``, ``say``, the API, each Ray actor) now resolves through
:func:`resolve_options`, so they record the same resolved options for the same inputs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cosyclone.base.device import DevicePolicy
from cosyclone.errors import CosycloneError
from cosyclone.model.config import ModelConfig
from cosyclone.options import RunOptions, check

LOAD_FORMATS = ("auto", "dummy")


def model_config(model_dir: str | Path | None, load_format: str = "auto") -> ModelConfig:
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


def resolve_options(opts: RunOptions) -> tuple[RunOptions, DevicePolicy]:
    """``opts`` with device, dtype, CPU GEMM library and CUDA graphs resolved (never ``auto``), and
    the :class:`~cosyclone.base.device.DevicePolicy` every builder takes. Idempotent: resolving a
    resolved set gives it back. Sets the process's thread counts (``threads``)."""
    from cosyclone.base.device import backend_name, resolve, set_threads
    from cosyclone.frontend.onnx import set_intra_op_threads
    from cosyclone.talker.graphs import resolve_cuda_graphs

    check(opts)
    device = "rocm" if opts.device == "cuda" and backend_name() == "rocm" else opts.device  # ROCm runs as cuda
    policy = resolve(device, opts.dtype, opts.cpu_gemm)
    set_threads(opts.threads)
    if opts.threads is not None:  # the ONNX sessions (speech tokenizer, CAM++) take the same count
        set_intra_op_threads(int(opts.threads))
    graphs = resolve_cuda_graphs("off" if opts.cuda_graphs == "off" else "auto", policy.device, draw=opts.draw)
    resolved = replace(opts, device=policy.device.type, dtype=policy.dtype_name, cpu_gemm=policy.cpu_gemm,
                       cuda_graphs=graphs.value)
    return resolved, policy
