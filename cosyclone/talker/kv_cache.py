"""A slot KV cache of fixed capacity: every layer's K and V for ``slots`` rows of ``capacity`` positions.

Why fixed capacity: a decode step whose shapes never change (whatever rows are running, whatever
their lengths) can be captured once as a CUDA graph or compiled once, and a finished row's slot
can be handed to the next row without reallocating or compacting anything. Why buffers: they
follow ``module.to(device)``, never enter ``state_dict()`` (the checkpoint key set stays exactly
``llm.json``) and keep their addresses for the whole decode (what a captured graph needs).

Layout: ``k``/``v`` are (L, slots, H_kv, capacity, D_head), one allocation each; layer ``i``
reads ``k[i]`` (a view). Slot ``s`` keeps its row's positions ``0..len-1`` in cells
``0..len-1``; cells past a row's length hold stale values of an earlier row, which the attention
mask hides (a step always writes its cell before attending to it). ``lengths`` (slots,) int64 on
the device holds each slot's current length: the next decode position.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cosyclone.model.config import QwenGeometry


class SlotKVCache(nn.Module):
    """K/V cells (L, slots, H_kv, capacity, D_head) and per-slot lengths (slots,)."""

    # registered buffers (non-persistent), typed for the checker
    k: Tensor
    v: Tensor
    lengths: Tensor

    #: per-slot buffers and the dimension of their slot (slot_views: a bucket's views, a row's move)
    SLOT_DIMS = {"k": 1, "v": 1, "lengths": 0}

    def __init__(self, geometry: QwenGeometry, slots: int, capacity: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        shape = (geometry.num_hidden_layers, slots, geometry.num_key_value_heads, capacity, geometry.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer(
            "lengths", torch.zeros(slots, dtype=torch.int64, device=device), persistent=False
        )

    @property
    def slots(self) -> int:
        return int(self.k.shape[1])

    @property
    def capacity(self) -> int:
        return int(self.k.shape[3])

    def write_prefix(self, layer: int, k: Tensor, v: Tensor, slots: Tensor) -> None:
        """Write a prefill block (b, H_kv, T, D) into cells ``0..T-1`` of the ``slots`` (b,) given."""
        t = k.shape[2]
        self.k[layer, slots, :, :t] = k
        self.v[layer, slots, :, :t] = v

    def write_step(
        self, layer: int, k: Tensor, v: Tensor, positions: Tensor, *, rows: Tensor | None = None
    ) -> None:
        """Write one new position per slot: ``k``/``v`` (slots, H_kv, 1, D) at cells ``positions`` (slots,).

        ``rows``: ``arange(slots)`` made once by the caller for every layer of a step (else made here).
        """
        if rows is None:
            rows = torch.arange(k.shape[0], device=k.device)
        self.k[layer, rows, :, positions] = k[:, :, 0]
        self.v[layer, rows, :, positions] = v[:, :, 0]

    def view(self, layer: int, length: int | None = None) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s K and V over cells ``0..length-1`` (all cells when None), as views."""
        if length is None:
            return self.k[layer], self.v[layer]
        return self.k[layer, :, :, :length], self.v[layer, :, :, :length]
