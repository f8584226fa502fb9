"""The frontend's ONNX sessions on a GPU: onnxruntime's CUDA provider with heuristic convolution
search and a capped arena that the sizing holds back; one GPU run per session at a time; the CPU
sessions as they were."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyclone.frontend import onnx


def test_the_cuda_provider_searches_heuristically_within_a_capped_arena() -> None:
    opts = onnx.provider_options("CUDAExecutionProvider", "speech_tokenizer_v3.onnx")
    assert opts["cudnn_conv_algo_search"] == "HEURISTIC"  # no exhaustive search per new prompt length
    assert int(opts["gpu_mem_limit"]) == onnx.GPU_ARENA_BYTES["speech_tokenizer_v3.onnx"]
    assert opts["arena_extend_strategy"] == "kSameAsRequested" and opts["device_id"].isdigit()
    assert int(onnx.provider_options("CUDAExecutionProvider", "campplus.onnx")["gpu_mem_limit"]) == \
        onnx.GPU_ARENA_BYTES["campplus.onnx"]
    rocm = onnx.provider_options("ROCMExecutionProvider", "other.onnx")
    assert int(rocm["gpu_mem_limit"]) == onnx.GPU_ARENA_DEFAULT
    assert onnx.provider_options("CPUExecutionProvider", "campplus.onnx") == {}


def test_the_sizing_holds_back_the_arenas_only_where_the_sessions_are_on_the_gpu() -> None:
    assert onnx.frontend_device_bytes("cpu") == 0
    import onnxruntime as ort

    gpu = "CUDAExecutionProvider" in ort.get_available_providers()
    assert onnx.frontend_device_bytes("cuda") == (sum(onnx.GPU_ARENA_BYTES.values()) if gpu else 0)


class FakeSession:
    def __init__(self, provider: str) -> None:
        self.provider = provider

    def get_providers(self) -> list[str]:
        return [self.provider, "CPUExecutionProvider"]


def test_a_gpu_session_runs_one_call_at_a_time_and_a_cpu_session_is_not_held() -> None:
    gpu, other = FakeSession("CUDAExecutionProvider"), FakeSession("CUDAExecutionProvider")
    lock = onnx.run_lock(gpu)
    assert isinstance(lock, type(threading.Lock())) and onnx.run_lock(gpu) is lock
    assert onnx.run_lock(other) is not lock
    cpu = FakeSession("CPUExecutionProvider")
    assert not isinstance(onnx.run_lock(cpu), type(threading.Lock()))


def test_cpu_sessions_still_build_and_run(tiny_model_dir: Path) -> None:
    models = onnx.OnnxModels(tiny_model_dir, ["CPUExecutionProvider"])
    wave = torch.sin(torch.arange(16000) / 40.0)
    assert models.speech_tokens(wave).numel() > 0 and models.speaker_embedding(wave).shape == (192,)


@pytest.mark.gpu
def test_the_frontend_on_the_gpu_provider_agrees_with_the_cpu(tiny_model_dir: Path) -> None:
    """Token agreement and embedding cosine, CUDA provider vs CPU, on the bundled prompts through the
    tiny stand-in graphs (convolutions, as in the released tokenizer). Without onnxruntime's CUDA
    provider (a CPU onnxruntime build) the frontend must stay on the CPU and hold nothing back: that
    is checked and said, since then there is no agreement to measure."""
    import onnxruntime as ort

    from cosyclone.frontend.audio import load_audio, resample

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert onnx.default_providers("cuda") == ["CPUExecutionProvider"]
        assert onnx.frontend_device_bytes("cuda") == 0
        print(f"onnxruntime {ort.__version__} offers no CUDA provider: the frontend runs on the CPU here; "
              "no token agreement to measure")
        return
    cpu = onnx.OnnxModels(tiny_model_dir, ["CPUExecutionProvider"])
    gpu = onnx.OnnxModels(tiny_model_dir, onnx.default_providers("cuda"))
    assert gpu._tok.get_providers()[0] == "CUDAExecutionProvider"
    same = total = 0
    cosines = []
    for path in sorted((Path(__file__).resolve().parents[2] / "manifests" / "prompts").glob("*.wav")):
        wave, sr = load_audio(path)
        w16 = resample(wave, sr, 16000)
        a, b = cpu.speech_tokens(w16), gpu.speech_tokens(w16)
        same, total = same + int((a == b).sum()), total + a.numel()
        ea, eb = cpu.speaker_embedding(w16), gpu.speaker_embedding(w16)
        cosines.append(float(np.dot(ea, eb) / (np.linalg.norm(ea) * np.linalg.norm(eb))))
    print(f"frontend CUDA vs CPU provider: tokens {same}/{total} equal, "
          f"embedding cosine >= {min(cosines):.6f}")
    assert same / total >= 0.95 and min(cosines) >= 0.9999
