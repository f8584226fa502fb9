"""Device and dtype selection: CUDA, ROCm (torch's HIP build reports itself as ``cuda``) or CPU.

What ``--dtype`` means, stage by stage (:attr:`DevicePolicy.stage_dtypes` names each):

* ``auto``: ``mixed`` on a CUDA or ROCm GPU for which ``torch.cuda.is_bf16_supported()`` is true
  (NVIDIA Ampere and newer, AMD MI200/MI300), fp32 on older GPUs and on every CPU. ``auto`` never
  picks fp16. The resolved name is what the run records (``summary.json`` options ``dtype``).
* ``mixed``: the talker backbone in fp32, the flow's DiT in bf16. Why not bf16 for the talker
  too: its tokens are sampled from its logits, and a reduced-precision backbone both moves them
  (bf16 picks fp32's token 97% of the time, docs/precision.md) and is where CosyVoice3's LLM has
  been reported to produce NaN logits in fp16/bf16 (vLLM-Omni PR #4168); a NaN row is what users
  of this tool count, so the default must not cause it. The DiT regresses mel frames, where bf16
  rounding is noise under the vocoder, and it is most of code2wav's arithmetic.
* ``bf16`` / ``fp16`` / ``fp32``: the talker backbone and the DiT both in that dtype. The talker's
  speech-token head and the sampler are fp32 in every dtype, and so is HiFT (its F0 predictor in
  float64).
* fp32 means fp32: TF32 is switched off for matmuls and cuDNN convolutions (:func:`apply_precision`)
  whatever the run dtype, because every fp32 op of this pipeline (head, sampler, HiFT, and all of
  an fp32 run) is fp32 on purpose. TF32 would give fp32 runs 10-bit mantissas on CUDA only.
* fp16 is accepted with a warning (:data:`FP16_WARNING`): the Qwen2 backbone is known to overflow
  fp16's range; HiFT is refused fp16 (always fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosyclone.errors import CosycloneError

# options.DtypeName, less auto
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

#: The ``--dtype`` word of a talker in fp32 with the DiT in bf16 (what ``auto`` picks on bf16 GPUs).
MIXED = "mixed"

#: Printed when a run uses fp16: where fp16 is known to overflow, and what is counted.
FP16_WARNING = (
    "fp16: the talker's Qwen2 backbone can overflow fp16's range (max 65504) in its residual stream "
    "and MLP activations, the known source of NaN logits in CosyVoice runs (spec 8.22a); such steps "
    "are counted per row (nan_steps) and excluded by the sampler, and a row left with no finite logit "
    "fails (no_finite_logits). The speech-token head and sampler run fp32; the flow's DiT runs fp16 "
    "(not known to overflow, not verified on released weights); HiFT is refused fp16 and runs fp32. "
    "Prefer bf16.")


@dataclass(frozen=True)
class DevicePolicy:
    """Where and in which precision the models run."""

    device: torch.device  # the torch device every module and buffer lives on
    dtype: torch.dtype  # run dtype of the talker backbone, and of the DiT unless flow_dtype says otherwise
    backend: str  # "cuda", "rocm" or "cpu", for diagnostics
    requested_dtype: str = "auto"  # the --dtype word this policy was resolved from
    cpu_gemm: str = "aten"  # "onednn" | "aten": the library of the fp32 linear layers on CPU (cpu_gemm.py)
    # the DiT's dtype when it differs from ``dtype`` (mixed); None: dtype
    flow_dtype: torch.dtype | None = None

    @property
    def dit_dtype(self) -> torch.dtype:
        """The dtype the flow (its DiT and the conditions fed to it) runs in."""
        return self.dtype if self.flow_dtype is None else self.flow_dtype

    @property
    def dtype_name(self) -> str:
        """``fp32`` | ``bf16`` | ``fp16`` | ``mixed``: the resolved ``--dtype`` word as the run records it
        (``mixed`` when the DiT runs in another dtype than the talker: see :attr:`stage_dtypes`)."""
        if self.dit_dtype != self.dtype:
            return MIXED
        return dtype_name(self.dtype)

    @property
    def stage_dtypes(self) -> dict[str, str]:
        """Each stage's compute dtype: ``talker`` (its Qwen2 backbone; head and sampler are fp32),
        ``flow`` (the DiT) and ``hift`` (always fp32, its F0 predictor float64)."""
        return {"talker": dtype_name(self.dtype), "flow": dtype_name(self.dit_dtype), "hift": "fp32"}

    @property
    def warnings(self) -> tuple[str, ...]:
        """Warnings a run in this precision must print (fp16: :data:`FP16_WARNING`)."""
        return (FP16_WARNING,) if self.dtype == torch.float16 else ()


def dtype_name(dtype: torch.dtype) -> str:
    """The short name (``fp32``/``bf16``/``fp16``) of a run dtype."""
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))


def backend_name() -> str:
    """``rocm`` on torch's HIP build with a GPU, ``cuda`` on CUDA, else ``cpu``."""
    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    return "cpu"


def apply_precision() -> None:
    """fp32 is fp32: no TF32 in matmuls (``torch.backends.cuda.matmul``) or cuDNN convolutions.

    Process-wide torch switches (they exist, and are observable, on CPU builds too); on a GPU
    without them fp32 matmuls and convs would silently run with a 10-bit mantissa.
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def resolve(device: str = "auto", dtype: str = "auto", cpu_gemm: str = "auto") -> DevicePolicy:
    """Turn CLI words into a :class:`DevicePolicy` (and switch TF32 off); a missing accelerator is a
    clear error. See the module docstring for what ``auto`` picks, and :mod:`cosyclone.base.cpu_gemm`
    for ``cpu_gemm``."""
    from cosyclone.base.cpu_gemm import resolve_cpu_gemm

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
    word = dtype.lower()
    if word == "auto":
        # fp32 on CPU is the faithful default; on GPUs with bf16 the DiT in bf16 (mixed); never fp16.
        word = MIXED if dev.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if word == MIXED:
        run_dtype, flow_dtype = torch.float32, torch.bfloat16
    elif word in _DTYPES:
        run_dtype, flow_dtype = _DTYPES[word], None
    else:
        raise CosycloneError(f"--dtype must be auto, mixed, bf16, fp16 or fp32, not {dtype!r}")
    gemm = resolve_cpu_gemm(cpu_gemm, dev)
    apply_precision()
    return DevicePolicy(
        device=dev,
        dtype=run_dtype,
        backend=device,
        requested_dtype=dtype.lower(),
        cpu_gemm=gemm,
        flow_dtype=flow_dtype,
    )


def set_threads(n: int | None) -> None:
    """``--threads N``: torch's intra-op threads (the engine sets the ONNX sessions' alongside).

    None leaves them as they are (torch's default: one per core).
    """
    if n is None:
        return
    if n < 1:
        raise CosycloneError(f"--threads must be at least 1, not {n}")
    torch.set_num_threads(int(n))
