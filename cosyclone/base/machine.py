"""The name of the processor a run ran on, as a person would look it up (lscpu's "Model name").

Why not :func:`platform.processor`: on Linux it answers the architecture (``x86_64``), which says
nothing about the speed a run record reports; the figures of a run are only comparable with the
processor's name beside them.
"""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
_NAME_KEYS = ("model name", "hardware", "processor", "cpu model")  # x86, then ARM and POWER spellings


def processor_name(cpuinfo: Path = CPUINFO) -> str:
    """The processor's model name with its logical CPU count (``Intel Xeon ... (2 CPUs)``).

    Read from ``cpuinfo`` on Linux, ``platform.processor()`` elsewhere (macOS names the chip there);
    the architecture when nothing better is known.
    """
    name, cores = "", 0
    try:
        lines = cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "processor" and value.isdigit():
            cores += 1
        elif key in _NAME_KEYS and value and not value.isdigit() and not name:
            name = " ".join(value.split())
    name = name or platform.processor() or platform.machine() or "unknown processor"
    return f"{name} ({cores} CPUs)" if cores else name
