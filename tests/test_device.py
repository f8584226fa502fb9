"""What --device/--dtype resolve to, TF32 switched off, and the fp16 warning (all observable on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cosyclone.base import device
from cosyclone.base.device import FP16_WARNING, resolve
from cosyclone.cli import app


def test_auto_is_fp32_on_cpu_and_records_both_words() -> None:
    p = resolve("cpu", "auto")
    assert (p.dtype, p.dtype_name, p.requested_dtype, p.backend) == (torch.float32, "fp32", "auto", "cpu")
    assert resolve("cpu", "BF16").dtype_name == "bf16" and resolve("cpu", "fp16").dtype_name == "fp16"


@pytest.mark.parametrize(("hip", "bf16_ok", "backend", "want"), [
    (None, True, "cuda", torch.bfloat16), (None, False, "cuda", torch.float32),
    ("6.2", True, "rocm", torch.bfloat16), ("6.2", False, "rocm", torch.float32)])
def test_auto_on_gpus_is_bf16_where_supported_and_never_fp16(monkeypatch: pytest.MonkeyPatch, hip: str | None,
                                                             bf16_ok: bool, backend: str, want: torch.dtype) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_ok)
    monkeypatch.setattr(torch.version, "hip", hip)
    p = resolve("auto", "auto")
    assert (p.backend, p.device.type, p.dtype) == (backend, "cuda", want)


def test_fp32_means_fp32_tf32_is_switched_off() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    try:
        resolve("cpu", "fp32")
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        device.apply_precision()


def test_fp16_warns_where_it_overflows_and_other_dtypes_do_not() -> None:
    assert resolve("cpu", "fp16").warnings == (FP16_WARNING,)
    assert "Qwen2 backbone" in FP16_WARNING and "HiFT is refused fp16" in FP16_WARNING
    assert resolve("cpu", "bf16").warnings == () and resolve("cpu", "fp32").warnings == ()


def test_cli_prints_the_fp16_warning_and_the_resolved_dtype(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text("")
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "--load-format", "dummy", "--device", "cpu",
                                   "--dtype", "fp16", "--dry-run", "--out", str(tmp_path / "o")])
    assert "warning: fp16: the talker's Qwen2 backbone can overflow" in res.output, res.output
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "--load-format", "dummy", "--device", "cpu",
                                   "--dry-run", "--out", str(tmp_path / "o")])
    assert "warning: fp16" not in res.output and "on cpu (fp32)" in res.output
