"""The first ``n`` slots of a slot module as views of its buffers, and a row's move between slots.

Why views: a decode step over the smallest bucket of slots that holds every running row costs
what its live rows cost, not what the whole slot count does (nano-vllm's batch-size buckets).
Views of the first ``n`` slots of the same buffers start at the same addresses, so a graph
captured on a view reads and writes the buffers every other bucket's graphs use, and the host's
bookkeeping (admission, harvest, the finished flags) keeps working on the full buffers.

Each slot module (the KV cache, the slot state, the sampler) names its per-slot buffers and the
dimension that indexes the slot in a ``SLOT_DIMS`` class attribute; every other buffer (sampler
constants) is shared as it is.
"""

from __future__ import annotations

import copy
from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)


def slot_dims(module: nn.Module) -> dict[str, int]:
    """``module``'s per-slot buffers and their slot dimension."""
    dims: dict[str, int] = vars(type(module))["SLOT_DIMS"]
    return dims


def narrowed(module: M, n: int) -> M:
    """A shallow copy of ``module`` whose per-slot buffers are views of their first ``n`` slots."""
    view = copy.copy(module)
    dims = slot_dims(module)
    bufs = {name: (b.narrow(dims[name], 0, n) if name in dims and b is not None else b)
            for name, b in module._buffers.items()}
    view.__dict__["_buffers"] = bufs
    return view


def move_slot(module: nn.Module, src: int, dst: int) -> None:
    """Copy every per-slot value of slot ``src`` into slot ``dst`` (in place: addresses are kept)."""
    for name, dim in slot_dims(module).items():
        buf = module.get_buffer(name)
        buf.select(dim, dst).copy_(buf.select(dim, src))
