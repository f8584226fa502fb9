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


@pytest.mark.parametrize(
    ("hip", "bf16_ok", "backend", "talker", "flow", "word"),
    [
        (None, True, "cuda", torch.float32, torch.bfloat16, "mixed"),
        (None, False, "cuda", torch.float32, torch.float32, "fp32"),
        ("6.2", True, "rocm", torch.float32, torch.bfloat16, "mixed"),
        ("6.2", False, "rocm", torch.float32, torch.float32, "fp32"),
    ],
)
def test_auto_on_gpus_keeps_the_talker_fp32_and_puts_the_dit_in_bf16_where_supported(
    monkeypatch: pytest.MonkeyPatch,
    hip: str | None,
    bf16_ok: bool,
    backend: str,
    talker: torch.dtype,
    flow: torch.dtype,
    word: str,
) -> None:
    """auto never gives the talker reduced precision (its logits pick the tokens; bf16/fp16 backbones
    are where NaN rows come from); the DiT takes bf16 where the GPU has it; never fp16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_ok)
    monkeypatch.setattr(torch.version, "hip", hip)
    p = resolve("auto", "auto")
    assert (p.backend, p.device.type, p.dtype, p.dit_dtype, p.dtype_name) == (
        backend,
        "cuda",
        talker,
        flow,
        word,
    )
    assert p.stage_dtypes == {"talker": "fp32", "flow": "bf16" if bf16_ok else "fp32", "hift": "fp32"}


def test_each_dtype_word_names_each_stage() -> None:
    """The record names every stage's dtype; ``bf16`` puts both the talker and the DiT in bf16."""
    got = {w: resolve("cpu", w).stage_dtypes for w in ("fp32", "bf16", "fp16", "mixed")}
    assert got == {"fp32": {"talker": "fp32", "flow": "fp32", "hift": "fp32"},
                   "bf16": {"talker": "bf16", "flow": "bf16", "hift": "fp32"},
                   "fp16": {"talker": "fp16", "flow": "fp16", "hift": "fp32"},
                   "mixed": {"talker": "fp32", "flow": "bf16", "hift": "fp32"}}
    assert resolve("cpu", "mixed").dtype_name == "mixed" and resolve("cpu", "auto").dtype_name == "fp32"


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
    res = CliRunner().invoke(
        app,
        [
            "synth",
            str(tmp_path / "m.jsonl"),
            "--load-format",
            "dummy",
            "--device",
            "cpu",
            "--dtype",
            "fp16",
            "--dry-run",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert "warning: fp16: the talker's Qwen2 backbone can overflow" in res.output, res.output
    res = CliRunner().invoke(
        app,
        [
            "synth",
            str(tmp_path / "m.jsonl"),
            "--load-format",
            "dummy",
            "--device",
            "cpu",
            "--dry-run",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert "warning: fp16" not in res.output and "on cpu (fp32)" in res.output
