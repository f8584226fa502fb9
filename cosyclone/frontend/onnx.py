"""onnxruntime sessions for the two released frontend models (speech tokenizer, CAM++).

One session per (model file, providers) per process: building a session costs far more than a
call, and the batch CLI prepares many rows. Input/output names are read from the session (the
official code addresses them by position), so released and tiny models both work.

On a CUDA run both sessions take onnxruntime's CUDA provider when this onnxruntime offers it, with
heuristic convolution search and a capped arena (:func:`provider_options`; why in
docs/performance.md); on CPU the sessions are as they were.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosyclone.errors import ModelDirError
from cosyclone.frontend.features import kaldi_fbank, mean_normalize, whisper_log_mel

# onnxruntime ships no type information: its sessions are Any to the checker
_SESSIONS: dict[tuple[str, tuple[str, ...], int], Any] = {}
_LOCK = threading.Lock()
MAX_TOKENIZER_SECONDS = 30.0
_INTRA_OP_THREADS = [1]  # upstream's 1 thread; ``--threads N`` sets N (see set_intra_op_threads)


def set_intra_op_threads(n: int) -> None:
    """Intra-op threads of the sessions built from now on (``--threads``; upstream uses 1).

    Sessions are cached per thread count, so a later call builds new ones rather than
    silently keeping the old count."""
    if n < 1:
        raise ValueError(f"intra-op threads must be at least 1, not {n}")
    _INTRA_OP_THREADS[0] = int(n)


#: The accelerator execution providers used for each torch backend, when the installed onnxruntime
#: offers them. ROCm: the ROCm provider was removed from recent onnxruntime releases; its successor,
#: MIGraphX, compiles a program per input shape and every prompt brings a new length, so it is not
#: picked: on a ROCm machine without the old provider the frontend runs on the CPU (its workers).
GPU_PROVIDERS = {"cuda": ("CUDAExecutionProvider",), "rocm": ("ROCMExecutionProvider",)}


#: The device memory each session's GPU arena may take (``gpu_mem_limit``), by model file: the
#: weights (the released speech tokenizer's are the larger part) and one run's activations on a 30 s
#: prompt, with room to spare (a run the cap cannot hold fails its row). DERIVED from the files'
#: sizes, not measured on a GPU. :func:`frontend_device_bytes` sums them for the sizing rule.
GPU_ARENA_BYTES = {"speech_tokenizer_v3.onnx": 3 << 30, "campplus.onnx": 1 << 30}
#: Any other ONNX file on a GPU provider (``cosyclone eval``'s CAM++ copy, a renamed model).
GPU_ARENA_DEFAULT = 1 << 30


def provider_options(name: str, model_file: str) -> dict[str, str]:
    """The options of execution provider ``name`` for ``model_file``'s session.

    CUDA: ``cudnn_conv_algo_search HEURISTIC``, because every prompt brings a new length and the
    default (``EXHAUSTIVE``) benchmarks every cuDNN algorithm for each new convolution shape, a
    stall per prompt; a ``gpu_mem_limit`` arena cap (:data:`GPU_ARENA_BYTES`) that the sizing rule
    subtracts, grown only as requested, so the arena is a known share of the card beside the torch
    models; the device torch uses. ROCm: the same cap. The CPU provider takes none.
    """
    if name not in ("CUDAExecutionProvider", "ROCMExecutionProvider"):
        return {}
    opts = {"gpu_mem_limit": str(GPU_ARENA_BYTES.get(model_file, GPU_ARENA_DEFAULT)),
            "arena_extend_strategy": "kSameAsRequested", "device_id": str(_torch_device_index())}
    if name == "CUDAExecutionProvider":
        opts["cudnn_conv_algo_search"] = "HEURISTIC"
    return opts


def _torch_device_index() -> int:
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def frontend_device_bytes(backend: str) -> int:
    """Device memory the frontend's two sessions may take on a run of ``backend`` (their arena caps
    when this onnxruntime offers the backend's GPU provider; 0 on CPU or without the provider)."""
    if not any(p in GPU_PROVIDERS.get(backend, ()) for p in default_providers(backend)):
        return 0
    return sum(GPU_ARENA_BYTES.values())


def default_providers(backend: str | None = None) -> list[str]:
    """The execution providers for the frontend's sessions, from what this onnxruntime build offers:
    ``backend`` (the run's torch backend) picks :data:`GPU_PROVIDERS`' entry (``cpu``: none); None
    takes any CUDA or ROCm provider offered. The CPU provider always comes last."""
    import onnxruntime as ort

    avail = ort.get_available_providers()
    wanted = (
        ("CUDAExecutionProvider", "ROCMExecutionProvider")
        if backend is None
        else GPU_PROVIDERS.get(backend, ())
    )
    return [p for p in wanted if p in avail] + ["CPUExecutionProvider"]


def get_session(path: str | Path, providers: list[str] | None = None) -> Any:
    """The cached ``InferenceSession`` for ``path`` (graph opt ALL, 1 intra-op thread as upstream
    unless :func:`set_intra_op_threads` said otherwise)."""
    import onnxruntime as ort

    path = Path(path).resolve()
    provs = tuple(providers or default_providers())
    threads = _INTRA_OP_THREADS[0]
    key = (str(path), provs, threads)
    with _LOCK:
        sess = _SESSIONS.get(key)
        if sess is None:
            if not path.is_file():
                raise ModelDirError(f"ONNX model not found: {path}")
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.intra_op_num_threads = threads
            chosen = [(p, provider_options(p, path.name)) for p in provs]
            try:
                sess = ort.InferenceSession(str(path), sess_options=opts, providers=chosen)
            except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
                raise ModelDirError(f"cannot load ONNX model {path}: {exc}") from exc
            _SESSIONS[key] = sess
        return sess


_RUN_LOCKS: dict[int, threading.Lock] = {}


def run_lock(session: Any) -> contextlib.AbstractContextManager[object]:
    """What a call to ``session.run`` holds: on a GPU provider one run at a time per session (the
    prompt workers' feature extraction stays parallel; concurrent GPU runs would each take their
    activations from the capped arena and could overrun it), on the CPU nothing."""
    providers = session.get_providers() if hasattr(session, "get_providers") else ["CPUExecutionProvider"]
    if providers[0] == "CPUExecutionProvider":
        return contextlib.nullcontext()
    with _LOCK:
        return _RUN_LOCKS.setdefault(id(session), threading.Lock())


class OnnxModels:
    """The speech tokenizer and CAM++ of one model directory, sessions shared process-wide."""

    def __init__(self, model_dir: str | Path, providers: list[str] | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.providers = providers
        self._tok = get_session(self.model_dir / "speech_tokenizer_v3.onnx", providers)
        self._spk = get_session(self.model_dir / "campplus.onnx", providers)

    def speech_tokens(self, wave16: torch.Tensor) -> torch.Tensor:
        """16 kHz wave (N,) → speech tokens LongTensor (P,) (whisper log-mel → ONNX)."""
        wave16 = wave16.reshape(-1)
        if wave16.numel() / 16000 > MAX_TOKENIZER_SECONDS:
            raise ModelDirError(f"speech tokenizer accepts at most {MAX_TOKENIZER_SECONDS:g} s of audio")
        feats, frames = whisper_log_mel(wave16[None])
        ins = self._tok.get_inputs()
        feed = {ins[0].name: feats.numpy().astype(np.float32),
                ins[1].name: np.asarray([int(frames[0])], dtype=np.int32)}
        with run_lock(self._tok):
            out = self._tok.run([self._tok.get_outputs()[0].name], feed)[0]
        return torch.from_numpy(np.asarray(out).reshape(-1).astype(np.int64))

    def speaker_embedding(self, wave16: torch.Tensor) -> torch.Tensor:
        """16 kHz wave (N,) → CAM++ speaker embedding (192,) float32 (mean-normalized fbank in)."""
        return campplus_embedding(self._spk, wave16)


def campplus_embedding(session: object, wave16: torch.Tensor) -> torch.Tensor:
    """16 kHz wave (N,) → embedding (D,) float32 from a CAM++ ``session`` (192 dims for the released one).

    Module-level so that ``cosyclone eval`` scores speaker similarity with exactly the features the
    frontend conditions on, without loading the speech tokenizer.
    """
    feats, frames = kaldi_fbank(wave16.reshape(1, -1))
    feats = mean_normalize(feats, frames)
    ins = session.get_inputs()  # type: ignore[attr-defined]
    with run_lock(session):
        out = session.run([session.get_outputs()[0].name],  # type: ignore[attr-defined]
                          {ins[0].name: feats.numpy().astype(np.float32)})[0]
    return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(-1).copy())
