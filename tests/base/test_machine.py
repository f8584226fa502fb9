"""A run record names the processor (lscpu's "Model name"), not the architecture that
platform.processor() gives on Linux."""

from __future__ import annotations

from pathlib import Path

from cosyclone.base.machine import processor_name

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R)   Platinum 8480+
flags\t\t: fpu vme

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R)   Platinum 8480+
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
CPU part\t: 0xd0c

Hardware\t: Ampere Altra
"""


def test_the_model_name_and_the_cpu_count_from_cpuinfo(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(X86)
    assert processor_name(path) == "Intel(R) Xeon(R) Platinum 8480+ (2 CPUs)"
    path.write_text(ARM)
    assert processor_name(path) == "Ampere Altra (1 CPUs)"


def test_without_cpuinfo_the_platform_s_word(tmp_path: Path) -> None:
    import platform

    fallback = platform.processor() or platform.machine() or "unknown processor"
    assert processor_name(tmp_path / "absent") == fallback
