"""What one ``--engine ray`` actor holds in memory, from measured figures and the model's geometry.

The figures behind the sizing rule of :mod:`cosyclone.ray.plan`: a process's base, the weights
counted from the geometry in the run dtype, the load's transient peak and a batch's activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosyclone.base.device import DevicePolicy
from cosyclone.model.config import ONNX_MODELS, ModelConfig

GIB = 1 << 30

# Measured footprint: ``python -m benchmarks.actor_footprint`` on the 2-core AMD EPYC (Zen 4), torch 2.13
# CPU, ray 2.60, released geometry, one fresh process per case with ray.data imported, first batch of 8 rows
# x 100 speech tokens (prompts of 2.3-3.7 s), 1 Euler step. RSS in GiB (weights: fp32 3.21, bf16 1.66):
#   real loader (full-size model directory): fp32 after load 3.72, load peak 4.80, after the batch 4.03;
#                                            bf16 after load 2.17, load peak 3.87, after the batch 2.37
#   dummy weights:                           fp32 after load 3.76, batch peak 4.12; bf16 2.20, peak 2.67
# After load no page of the checkpoint files is mapped (the loader copies every tensor into the module's
# own memory): the weights are private to each actor, nothing is shared between the actors of a node.
#: A CPU actor's resident bytes besides weights, batch and ONNX: Python, torch, Ray Data, the text
#: frontend (tokenizer, wetext), the tiny ONNX sessions. RSS after load minus the weights, 0.51-0.55 GiB.
BASE_BYTES = int(0.55 * GIB)
#: The load's peak above the RSS after it, per byte of weights, by run dtype, with the real loader:
#: checkpoint pages mapped while they are copied (page cache: counted in each actor's RSS although
#: the actors of a node share them) and, in bf16, the flow built in fp32 before it is cast.
#: fp32: 1.07 GiB over 3.21; bf16: 1.69 GiB over 1.66 (dummy weights: 0 and 0.47 GiB).
LOAD_PEAK_PER_WEIGHT_BYTE = {"fp32": 0.34, "bf16": 1.02, "fp16": 1.02}
#: The first batch's peak above the RSS after load, per row of the batch, measured with dummy weights
#: (no load peak to hide it) on 8 rows of 300 tokens (12 s of audio each): fp32 0.51 GiB (0.36 at 100
#: tokens); bf16 0.37 GiB of RSS after the batch (its peak stays under the load's). Longer rows need more.
ACTIVATION_BYTES_PER_ROW = int(0.51 * GIB / 8)
#: onnxruntime's resident bytes per byte of ONNX file (the speech tokenizer and CAM++ of a model
#: directory) once the session is made, and its extra peak while making it; measured on a synthetic
#: graph with a 256 MiB initializer (1.11x resident, 2.11x at the peak).
ONNX_RSS_PER_FILE_BYTE = 1.11
ONNX_LOAD_PEAK_PER_FILE_BYTE = 1.0
#: Host memory of a GPU actor for the CUDA/ROCm runtime and its libraries: an allowance, NOT measured
#: (the development machine has no GPU); its weights and activations are on the GPU.
GPU_HOST_ALLOWANCE = int(1.5 * GIB)
FOOTPRINT_SOURCE = ("measured by benchmarks/actor_footprint.py on an AMD EPYC (Zen 4); weights counted "
                    "from the model's geometry")


@dataclass(frozen=True)
class Footprint:
    """What one actor holds, in bytes, and where the figures come from."""

    host_bytes: int  # peak resident memory of the actor's process: base + weights + max(load peak, batch)
    gpu_bytes: int  # on its GPU: weights and first batch (0 on a CPU run)
    weights_bytes: int
    # parameters and buffers in the run dtype (head, HiFT: fp32), counted from the geometry
    base_bytes: int
    # the process without weights or batch (BASE_BYTES, the ONNX sessions; GPU: the allowance)
    load_peak_bytes: int
    # the load's transient peak above the loaded process (0 on GPU: it is on the host once)
    batch_bytes: int  # the first batch's activations at the run's batch size
    batch_size: int  # rows per batch the activations were scaled to
    source: str  # where the figures come from

    def as_record(self) -> dict[str, Any]:
        return {
            "host_bytes": self.host_bytes,
            "gpu_bytes": self.gpu_bytes,
            "weights_bytes": self.weights_bytes,
            "base_bytes": self.base_bytes,
            "load_peak_bytes": self.load_peak_bytes,
            "batch_bytes": self.batch_bytes,
            "batch_size": self.batch_size,
            "source": self.source,
        }


def weight_bytes(cfg: ModelConfig, policy: DevicePolicy) -> int:
    """Bytes of the three models' parameters and buffers in the policy's dtype as the builders lay
    them out on its device (talker and DiT in the run dtype, the speech-token head fp32, HiFT fp32
    with its F0 predictor float64 and, on CPU, its FFT convs' spectra), counted on the meta device:
    nothing is allocated or read."""
    from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
    from cosyclone.code2wav.hift import CausalHiFTGenerator, fft_rule_for
    from cosyclone.talker.model import CosyVoice3LM

    dtype = policy.dtype
    with torch.device("meta"):
        talker = CosyVoice3LM(cfg.talker).to(dtype)
        talker.llm_decoder.to(torch.float32)
        flow = CausalMaskedDiffWithDiT(cfg.flow).to(dtype)
        hift = CausalHiFTGenerator(cfg.hift)
        hift.fold_weight_norm(fft=fft_rule_for(policy))
        hift.f0_predictor.double()
    return sum(t.numel() * t.element_size() for m in (talker, flow, hift)
               for t in (*m.parameters(), *m.buffers()))


def onnx_bytes(cfg: ModelConfig) -> int:
    """Bytes of the model directory's ONNX files (0 without a directory: the built-in tiny ones)."""
    if cfg.model_dir is None:
        return 0
    return sum(p.stat().st_size for p in (Path(cfg.model_dir) / n for n in ONNX_MODELS) if p.is_file())


def actor_footprint(cfg: ModelConfig, policy: DevicePolicy, batch_size: int) -> Footprint:
    """One actor's peak memory for this model, precision and batch size, from the measured constants:
    base + ONNX sessions + weights + the larger of the load's peak and the first batch's activations
    (the load's and ONNX's peaks come one after the other, the batch after both)."""
    name = policy.dtype_name
    weights = weight_bytes(cfg, policy)
    onnx = onnx_bytes(cfg)
    base = BASE_BYTES + int(ONNX_RSS_PER_FILE_BYTE * onnx)
    batch = ACTIVATION_BYTES_PER_ROW * batch_size
    if policy.device.type == "cpu":
        load = max(
            int(LOAD_PEAK_PER_WEIGHT_BYTE.get(name, 1.0) * weights), int(ONNX_LOAD_PEAK_PER_FILE_BYTE * onnx)
        )
        return Footprint(host_bytes=base + weights + max(load, batch), gpu_bytes=0, weights_bytes=weights,
                         base_bytes=base, load_peak_bytes=load, batch_bytes=batch, batch_size=batch_size,
                         source=FOOTPRINT_SOURCE)
    host = base + GPU_HOST_ALLOWANCE + int(ONNX_LOAD_PEAK_PER_FILE_BYTE * onnx)
    return Footprint(
        host_bytes=host,
        gpu_bytes=weights + batch,
        weights_bytes=weights,
        base_bytes=host,
        load_peak_bytes=0,
        batch_bytes=batch,
        batch_size=batch_size,
        source=FOOTPRINT_SOURCE + "; on GPU: the activations as measured on CPU and a host allowance "
        "for the CUDA runtime, not measured",
    )
