"""What machine a benchmark figure was measured on: every printed figure names it.

The official CPU constants came from an Intel Xeon with AMX; on an AVX2-only AMD EPYC the same code is
1.5x slower and bf16 is emulated (the flow about 6.8x slower than fp32), so a ratio printed without
the machine beside it misleads.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> set[str]:
    for line in _cpuinfo():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16() -> bool:
    """True when the CPU computes bf16 matmuls natively (AMX or AVX512-BF16), not by emulation."""
    flags = cpu_flags()
    return bool({"amx_bf16", "avx512_bf16"} & flags)


def describe() -> str:
    """``"AMD EPYC 9B14, 2 CPUs, AVX-512 (bf16 native)"``-style line for a benchmark's header."""
    flags = cpu_flags()
    isa = (
        "AMX"
        if "amx_bf16" in flags
        else "AVX-512"
        if "avx512f" in flags
        else "AVX2"
        if "avx2" in flags
        else "?"
    )
    return f"{cpu_name()}, {os.cpu_count()} CPUs, {isa} (bf16 {'native' if native_bf16() else 'emulated'})"
