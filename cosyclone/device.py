"""Device and dtype selection: CUDA, ROCm (torch's HIP build reports itself as ``cuda``) or CPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import CosycloneError

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class DevicePolicy:
    """Where and in which precision the models run."""

    device: torch.device  # the torch device every module and buffer lives on
    dtype: torch.dtype  # run dtype of the talker and the DiT (HiFT's F0 predictor stays float64)
    backend: str  # "cuda", "rocm" or "cpu", for diagnostics


def backend_name() -> str:
    """``rocm`` on torch's HIP build with a GPU, ``cuda`` on CUDA, else ``cpu``."""
    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return "cpu"


def resolve(device: str = "auto", dtype: str = "auto") -> DevicePolicy:
    """Turn CLI words into a :class:`DevicePolicy`; a missing accelerator is a clear error."""
    device = device.lower()
    found = backend_name()
    if device == "auto":
        device = found
    if device in ("cuda", "rocm"):
        if found == "cpu":
            raise CosycloneError(f"--device {device} requested but torch sees no GPU "
                                 f"(torch {torch.__version__}); use --device cpu")
        if device != found:
            raise CosycloneError(f"--device {device} requested but this torch build is {found}")
        dev = torch.device("cuda")
    elif device == "cpu":
        dev = torch.device("cpu")
    else:
        raise CosycloneError(f"--device must be auto, cuda, rocm or cpu, not {device!r}")
    if dtype == "auto":
        # fp32 on CPU is the faithful default; bf16 on GPUs that support it.
        run_dtype = torch.bfloat16 if dev.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    else:
        if dtype.lower() not in _DTYPES:
            raise CosycloneError(f"--dtype must be auto, bf16, fp16 or fp32, not {dtype!r}")
        run_dtype = _DTYPES[dtype.lower()]
    return DevicePolicy(device=dev, dtype=run_dtype, backend=device)
