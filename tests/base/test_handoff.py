"""Handoff serializer: exact round trips, stable wire bytes, loud failures on damage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cosyclone.base import handoff
from cosyclone.errors import CosycloneError

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _sample(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64) * 50
    if dtype.is_complex:
        return torch.complex(x, -x).to(dtype)
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype(dtype: torch.dtype) -> None:
    t = _sample(dtype)
    out = handoff.loads(handoff.dumps({"x": t, "zero": t[0, 0].clone(), "empty": t[:0]}))
    assert _bits_equal(out["x"], t)
    assert out["zero"].dim() == 0 and _bits_equal(out["zero"], t[0, 0])
    assert out["empty"].shape == (0, 5) and out["empty"].dtype == dtype


def test_bf16_nan_payload_bits_survive() -> None:
    raw = torch.tensor([0x7FC1, 0xFF81, 0x0001, 0x8000], dtype=torch.int32).to(torch.int16)
    t = raw.view(torch.bfloat16)
    assert _bits_equal(handoff.loads(handoff.dumps({"t": t}))["t"], t)


def test_non_contiguous_and_deep_nesting() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    nc = base.t()[::2]
    tree: dict[str, Any] = {"text_ids": torch.arange(5), "n": 3, "name": "row-1", "seeds": [1, 2, 3],
            "embed": {"speech_token": torch.arange(4, dtype=torch.int32), "nc": nc,
                      "deeper": {"a": {"b": {"c": torch.ones(2, dtype=torch.bfloat16)}}, "empty": {}}}}
    out: dict[str, Any] = handoff.loads(handoff.dumps(tree))
    assert set(out) == set(tree)
    assert torch.equal(out["embed"]["nc"], nc) and out["embed"]["nc"].is_contiguous()
    assert torch.equal(out["embed"]["speech_token"], tree["embed"]["speech_token"])
    assert out["embed"]["deeper"]["a"]["b"]["c"].dtype == torch.bfloat16
    assert out["embed"]["deeper"]["empty"] == {}
    assert out["n"] == 3 and out["name"] == "row-1" and out["seeds"] == [1, 2, 3]
    assert not any(handoff.SEP in k for k in out)


def test_wire_bytes_deterministic() -> None:
    def build() -> dict:
        return {"a": torch.linspace(0, 1, 7), "b": {"c": torch.arange(3, dtype=torch.int8)}, "s": "x"}
    assert handoff.dumps(build()) == handoff.dumps(build())


def test_decoded_tensor_is_writable_and_independent() -> None:
    data = bytearray(handoff.dumps({"x": torch.zeros(4)}))
    out = handoff.loads(data)
    out["x"] += 1
    assert handoff.loads(data)["x"].sum() == 0


def test_corrupted_and_truncated_fail_loudly(tmp_path: Path) -> None:
    path = handoff.save(tmp_path / "h.bin", {"x": torch.arange(100, dtype=torch.float32)})
    assert torch.equal(handoff.load(path)["x"], torch.arange(100, dtype=torch.float32))
    data = bytearray(path.read_bytes())
    bad = bytearray(data)
    bad[-7] ^= 0x10
    with pytest.raises(handoff.HandoffError, match="checksum"):
        handoff.loads(bytes(bad))
    with pytest.raises(handoff.HandoffError, match="truncated"):
        handoff.loads(bytes(data[:-3]))
    with pytest.raises(handoff.HandoffError, match="truncated"):
        handoff.loads(bytes(data[:10]))
    with pytest.raises(handoff.HandoffError, match="magic"):
        handoff.loads(b"X" + bytes(data[1:]))
    (tmp_path / "t.bin").write_bytes(bytes(data[:50]))
    with pytest.raises(CosycloneError, match="t.bin"):
        handoff.load(tmp_path / "t.bin")


def test_unsupported_values_rejected() -> None:
    with pytest.raises(handoff.HandoffError, match="dtype"):
        handoff.dumps({"x": torch.zeros(2, dtype=torch.uint16)})
    with pytest.raises(handoff.HandoffError, match="key"):
        handoff.dumps({"a/b": torch.zeros(1)})
    with pytest.raises(handoff.HandoffError, match="unsupported value"):
        handoff.dumps({"x": [torch.zeros(1)]})
    with pytest.raises(handoff.HandoffError, match="non-finite"):
        handoff.dumps({"x": float("nan")})


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized and nested tensors: deprecated/prototype
@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "quantized", "meta", "nested"])
def test_tensors_the_format_cannot_carry_exactly_are_refused_by_name(kind: str) -> None:
    dense = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    t = {"sparse_coo": lambda: dense.to_sparse(),
         "sparse_csr": lambda: dense.to_sparse_csr(),
         "quantized": lambda: torch.quantize_per_tensor(dense, scale=0.5, zero_point=0, dtype=torch.qint8),
         "meta": lambda: torch.empty(2, 2, device="meta"),
         "nested": lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])}[kind]()
    with pytest.raises(handoff.HandoffError, match=r"'embed/speech_feat': .*dense strided tensors only"):
        handoff.dumps({"embed": {"speech_feat": t}})


def test_conjugate_and_negative_views_carry_the_values_they_read_as() -> None:
    z = torch.complex(torch.tensor([1.0, -2.0]), torch.tensor([3.0, 4.0]))
    for view in (z.conj(), torch._neg_view(z)):  # lazy bits, not materialized values
        back = handoff.loads(handoff.dumps({"v": view}))["v"]
        assert torch.equal(back, view.resolve_conj().resolve_neg())
