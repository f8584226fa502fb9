"""Preallocated per-layer KV cache kept as non-persistent buffers.

Why buffers: they follow ``module.to(device)``, never enter ``state_dict()`` (so the checkpoint key
set stays exactly ``llm.json``), and are allocated once per batch so decode steps never allocate.
The cache is sized from the same :class:`~cosyclone.config.QwenGeometry` that builds the attention
layers, so a geometry mismatch cannot silently produce a wrongly shaped cache.

Layout: ``k``/``v`` are (B, H_kv, T_max, D_head). Row ``b`` keeps its own positions
``0..len_b-1`` in slots ``0..len_b-1`` (right padding); slots past a row's length hold stale values
that the attention mask hides.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import QwenGeometry


class KVCache(nn.Module):
    """One attention layer's K and V cache (B, H_kv, T_max, D_head)."""

    def __init__(self, geometry: QwenGeometry, batch: int, max_len: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        shape = (batch, geometry.num_key_value_heads, max_len, geometry.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def batch(self) -> int:
        return int(self.k.shape[0])

    @property
    def max_len(self) -> int:
        return int(self.k.shape[2])

    def write_prefix(self, k: Tensor, v: Tensor) -> None:
        """Write a prefill block (B, H_kv, T, D) into slots ``0..T-1`` of every row."""
        t = k.shape[2]
        self.k[:, :, :t] = k
        self.v[:, :, :t] = v

    def write_at(self, k: Tensor, v: Tensor, slots: Tensor) -> None:
        """Write one new position per row: ``k``/``v`` (B, H_kv, 1, D) at ``slots`` (B,) int64."""
        rows = torch.arange(k.shape[0], device=k.device)
        self.k[rows, :, slots] = k[:, :, 0]
        self.v[rows, :, slots] = v[:, :, 0]

    def view(self, length: int) -> tuple[Tensor, Tensor]:
        """The first ``length`` slots of K and V, (B, H_kv, length, D) views (no copy)."""
        return self.k[:, :, :length], self.v[:, :, :length]

    def keep_rows(self, index: Tensor) -> None:
        """Compact the batch to ``index`` (b,) rows, freeing the work of finished rows."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)
