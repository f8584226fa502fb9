"""Peak memory of this process: host RSS and, on a GPU, the caching allocator's peaks.

Why a run records them: the sizing rule (:mod:`cosyclone.engine.sizing`) turns free memory into
talker slots and code2wav budgets from measured constants; a run's own peaks are what shows
whether those constants hold on the machine it ran on, and what a user sizing a shared machine
needs to know. Generic (no model knowledge), so it lives in ``base``.

Host: the kernel's ``VmHWM`` (peak resident set) from ``/proc/self/status``, else
``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux, bytes on macOS). GPU:
``torch.cuda.max_memory_allocated`` (what tensors held at most) and ``max_memory_reserved`` (what
the caching allocator took from the driver at most, the figure that competes with other
processes). Both are peaks since the process started or since :func:`reset_peaks`.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class PeakMemory:
    """Peaks since the process started (or since :func:`reset_peaks`)."""

    host_rss_bytes: int  # peak resident set size of the process (VmHWM, else ru_maxrss)
    gpu_allocated_bytes: int | None  # torch.cuda.max_memory_allocated on the run's device; None on CPU
    gpu_reserved_bytes: int | None  # torch.cuda.max_memory_reserved on the run's device; None on CPU

    def as_record(self) -> dict[str, Any]:
        """JSON-able form (``runs.jsonl`` / ``summary.json``)."""
        return {"host_rss_bytes": self.host_rss_bytes, "gpu_allocated_bytes": self.gpu_allocated_bytes,
                "gpu_reserved_bytes": self.gpu_reserved_bytes}

    def describe(self) -> str:
        """One line: ``peak memory: host 3.1 GB, GPU 12.0 GB allocated / 14.2 GB reserved``."""
        gpu = "" if self.gpu_allocated_bytes is None else (
            f", GPU {_gb(self.gpu_allocated_bytes)} allocated / {_gb(self.gpu_reserved_bytes or 0)} reserved")
        return f"peak memory: host {_gb(self.host_rss_bytes)}{gpu}"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def host_peak_bytes() -> int:
    """Peak resident set size of this process in bytes (see the module docstring)."""
    status = Path("/proc/self/status")
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _is_gpu(device: torch.device | str | None) -> bool:
    return device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()


def read_peaks(device: torch.device | str | None = None) -> PeakMemory:
    """The peaks now: host always, the GPU's when ``device`` is a CUDA/ROCm device."""
    if not _is_gpu(device):
        return PeakMemory(host_peak_bytes(), None, None)
    dev = torch.device(device)  # type: ignore[arg-type]
    return PeakMemory(host_peak_bytes(), int(torch.cuda.max_memory_allocated(dev)),
                      int(torch.cuda.max_memory_reserved(dev)))


def reset_peaks(device: torch.device | str | None = None) -> None:
    """Start the peaks afresh: the GPU's always, the host's where Linux allows (``clear_refs`` 5
    sets VmHWM to the current RSS; elsewhere the host peak stays the process's)."""
    if _is_gpu(device):
        torch.cuda.reset_peak_memory_stats(torch.device(device))  # type: ignore[arg-type]
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
